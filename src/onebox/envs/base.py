"""What every onebox env pool shares: the Gymnasium `VectorEnv` API plus EnvPool's async API.

An env pool holds `num_envs` envs. The sync API (`reset`, `step`) works on all of them at once and
returns results in env order. The async API (`async_reset`, `send`, `recv`) lets the caller send
actions for any subset of envs and receive the first `batch_size` envs to finish; `info["env_id"]`
says which envs a batch holds.

As in Gymnasium, an env must be reset before it is stepped: `step`/`send` before `reset`/
`async_reset` raise `gymnasium.error.ResetNeeded`, as do steps of an env whose episode ended in
`AutoresetMode.DISABLED` until `reset(options={"reset_mask": mask})` resets it.
"""

from __future__ import annotations

import abc
import difflib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode, VectorEnv

SeedLike = int | Sequence[int] | None

EPISODE_CAP = 27_000
"""The episode cap, in env steps, that evaluation (`onebox eval`, evolution) gives an env without
a time limit of its own, as Atari's 108,000 frames at frameskip 4: otherwise a policy can play
one episode forever (one that waits at MinAtar Seaquest's surface never runs out of oxygen)."""


def time_limit(spec: EnvSpec | None) -> int | None:
    """The env step at which a pool with this `spec` truncates episodes by itself: the spec's
    `max_episode_steps`, or ALE's frame cap (`max_num_frames_per_episode`) in steps; None if
    its episodes can run forever."""
    if spec is None:
        return None
    frames = spec.kwargs.get("max_num_frames_per_episode")
    if frames is not None:
        return -(-int(frames) // int(spec.kwargs.get("frameskip", 1))) or None
    return spec.max_episode_steps or None


def cap_options(spec: EnvSpec | None, steps: int) -> dict[str, int]:
    """`make` options that end a pool's episodes after `steps` env steps: ALE's frame cap for
    Atari pools (`frameskip` frames a step; a reset's no-ops do not count), else
    `max_episode_steps`."""
    if spec is not None and "max_num_frames_per_episode" in spec.kwargs:
        return {"max_num_frames_per_episode": steps * int(spec.kwargs.get("frameskip", 1))}
    return {"max_episode_steps": steps}


def physical_cores() -> int:
    """Physical CPU cores usable by this process (hyperthread siblings counted once)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cpus:
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        try:
            with open(path) as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


def check_pool_args(num_envs: Any, batch_size: Any, num_threads: Any) -> tuple[int, int, int]:
    """Validate the pool size arguments; return (num_envs, batch_size, num_threads) resolved."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or num_envs <= 0:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    if batch_size is None:
        batch_size = num_envs
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise ValueError(f"batch_size must be an integer, got {batch_size!r}")
    if not 1 <= batch_size <= num_envs:
        raise ValueError(
            f"batch_size must be between 1 and num_envs={num_envs}, got {batch_size}; "
            "recv() returns batch_size envs, so it cannot exceed the pool"
        )
    if num_threads is None:
        num_threads = physical_cores()
    if isinstance(num_threads, bool) or not isinstance(num_threads, int | np.integer):
        raise ValueError(f"num_threads must be an integer, got {num_threads!r}")
    if num_threads <= 0:
        raise ValueError(f"num_threads must be >= 1, got {num_threads} (None picks the core count)")
    return int(num_envs), int(batch_size), int(num_threads)


def expand_seeds(seed: SeedLike, num_envs: int) -> list[int]:
    """Per-env seeds as Gymnasium's vector envs do: `seed + i` for an int, or one per env."""
    if seed is None:
        return []
    if _is_int(seed):
        seeds = [int(seed) + i for i in range(num_envs)]
    elif isinstance(seed, Sequence | np.ndarray) and not isinstance(seed, str | bytes):
        if not all(_is_int(s) for s in seed):
            raise TypeError(f"seeds must be integers, got {list(seed)!r}")
        seeds = [int(s) for s in seed]
        if len(seeds) != num_envs:
            raise ValueError(
                f"got {len(seeds)} seeds for {num_envs} envs; pass one per env or an int"
            )
    else:
        raise TypeError(
            f"seed must be None, an int or a sequence of ints, got {type(seed).__name__}"
        )
    if any(s < 0 or s >= 2**64 for s in seeds):
        raise ValueError("seeds must be in [0, 2**64)")
    return seeds


def _is_int(x: Any) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)


def check_seed(seed: Any) -> int:
    """Validate a base seed: an integer in [0, 2**64)."""
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be a non-negative integer below 2**64, got {seed!r}")
    return int(seed)


def parse_autoreset_mode(mode: str | AutoresetMode) -> AutoresetMode:
    """Parse an autoreset mode ("NextStep"/"next_step", "SameStep"/"same_step",
    "Disabled"/"disabled")."""
    if isinstance(mode, str):
        aliases = {"next_step": "NextStep", "same_step": "SameStep", "disabled": "Disabled"}
        mode = aliases.get(mode.lower(), mode)
    try:
        return AutoresetMode(mode)
    except ValueError:
        raise ValueError(
            f"autoreset_mode must be 'NextStep', 'SameStep' or 'Disabled', got {mode!r}"
        ) from None


class ActionShapeError(TypeError, ValueError):
    """Actions that are not an array of the batch's shape: a `TypeError`, as Gymnasium's vector
    envs raise for them, and a `ValueError` (what onebox raised before, still caught as such)."""


def reset_needed(what: str) -> ResetNeeded:
    """The error for stepping an env that was never reset (Gymnasium's `ResetNeeded`)."""
    return ResetNeeded(f"{what} before reset(): call reset() (or async_reset()) first")


def split_reset_options(
    options: dict[str, Any] | None, num_envs: int
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """`(reset_mask or None, the other options)` from `reset(options=...)`, the mask checked as
    Gymnasium's vector envs do: a bool numpy array of shape `(num_envs,)` with a True value."""
    if options is None:
        return None, {}
    if not isinstance(options, dict):
        raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
    rest = dict(options)
    if "reset_mask" not in rest:
        return None, rest
    mask = rest.pop("reset_mask")
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"options['reset_mask'] must be a numpy array, got {type(mask).__name__}")
    if mask.shape != (num_envs,):
        raise ValueError(f"options['reset_mask'] must have shape ({num_envs},), got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"options['reset_mask'] must have dtype bool, got {mask.dtype}")
    if not mask.any():
        raise ValueError("options['reset_mask'] must have at least one True value")
    return mask.copy(), rest


class EnvPool(VectorEnv, abc.ABC):
    """A Gymnasium `VectorEnv` with EnvPool's async `send`/`recv` API; a context manager.

    `get_attr`, `set_attr` and `call` reach the envs' attributes. Pools without Python env objects
    (native, Atari) have the subset `env_attrs` returns; setting one raises `AttributeError`
    (their options are fixed when the pool is made).
    """

    batch_size: int

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abc.abstractmethod
    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Start stepping envs `env_ids` (default: all) with `actions` (one row per id)."""

    @abc.abstractmethod
    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the first `batch_size` sent envs to finish; `info["env_id"]` names them."""

    @abc.abstractmethod
    def async_reset(self, seed: SeedLike = None) -> None:
        """Reset every env; the first observations come out of `recv`."""

    @property
    @abc.abstractmethod
    def np_random_seed(self) -> tuple[int, ...]:
        """Each env's seed, as Gymnasium's vector envs report it (`seed + i` after
        `reset(seed=seed)`)."""

    # ---- attributes of the envs (pools without Python env objects) ----------------------------

    def env_attrs(self) -> dict[str, tuple[Any, ...]]:
        """The env attributes `get_attr` and `call` know, one value per env: the single spaces,
        `spec`, `metadata`, `render_mode`, `np_random_seed` and the env's options."""
        n = self.num_envs
        attrs: dict[str, Any] = {
            "observation_space": self.single_observation_space,
            "action_space": self.single_action_space,
            "spec": self.spec,
            "metadata": self.metadata,
            "render_mode": self.render_mode,
        }
        if self.spec is not None:
            attrs.update(self.spec.kwargs)
        table = {name: (value,) * n for name, value in attrs.items()}
        table["np_random_seed"] = self.np_random_seed
        return table

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute `name` of every env (one of `env_attrs`)."""
        attrs = self.env_attrs()
        if name not in attrs:
            raise AttributeError(
                f"{type(self).__name__} envs have no attribute {name!r}: they are not Python "
                f"objects; get_attr and call know {', '.join(sorted(attrs))}"
            )
        return attrs[name]

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """As Gymnasium's `call`; these envs have no methods, so it is `get_attr(name)`."""
        if args or kwargs:
            raise TypeError(f"{type(self).__name__} envs have no methods to call with arguments")
        return self.get_attr(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Not possible: the options of these envs are fixed when the pool is made."""
        raise AttributeError(
            f"cannot set {name!r}: {type(self).__name__} envs are fixed when the pool is made; "
            "make a new pool with the option (onebox.envs.make(env_id, n, option=value))"
        )


def apply_options(
    env_id: str,
    declared: dict[str, tuple[Any, str]],
    config: dict[str, Any],
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """`config` (the option values to start from) with the user's `kwargs` applied: each name
    must be one of `declared` (name -> (default, doc)) and each value of its default's type
    (bool, int, float, a tuple of that many numbers, or str); raises TypeError naming the option."""
    config = dict(config)
    for name, value in kwargs.items():
        if name not in declared:
            close = difflib.get_close_matches(name, declared, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            known = ", ".join(declared) or "none"
            raise TypeError(f"{env_id} has no option {name!r}.{hint} Its options: {known}.")
        default = declared[name][0]
        if isinstance(default, bool):
            ok = isinstance(value, bool | np.bool_)
            value = bool(value) if ok else value
        elif isinstance(default, int):
            ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
            value = int(value) if ok else value
        elif isinstance(default, float):
            ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
                value, bool
            )
            value = float(value) if ok else value
        elif isinstance(default, tuple):
            ok = (
                isinstance(value, tuple | list | np.ndarray)
                and len(value) == len(default)
                and all(
                    isinstance(v, int | float | np.integer | np.floating)
                    and not isinstance(v, bool)
                    for v in value
                )
            )
            value = tuple(float(v) for v in value) if ok else value
            if not ok:
                raise TypeError(
                    f"{env_id} option {name!r} takes a tuple of {len(default)} numbers, "
                    f"got {value!r}"
                )
        else:
            ok = isinstance(value, str)
        if not ok:
            raise TypeError(
                f"{env_id} option {name!r} takes a {type(default).__name__}, got {value!r}"
            )
        config[name] = value
    return config
