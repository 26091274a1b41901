"""What every onebox env pool shares: the Gymnasium `VectorEnv` API plus EnvPool's async API.

An env pool holds `num_envs` envs. The sync API (`reset`, `step`) works on all of them at once and
returns results in env order. The async API (`async_reset`, `send`, `recv`) lets the caller send
actions for any subset of envs and receive the first `batch_size` envs to finish; `info["env_id"]`
says which envs a batch holds.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

SeedLike = int | Sequence[int] | None


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
    """Parse an autoreset mode ("NextStep"/"next_step", "SameStep"/"same_step")."""
    if isinstance(mode, str):
        mode = {"next_step": "NextStep", "same_step": "SameStep"}.get(mode.lower(), mode)
    try:
        parsed = AutoresetMode(mode)
    except ValueError:
        parsed = None
    if parsed not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
        raise ValueError(f"autoreset_mode must be 'NextStep' or 'SameStep', got {mode!r}")
    return parsed


class EnvPool(VectorEnv, abc.ABC):
    """A Gymnasium `VectorEnv` with EnvPool's async `send`/`recv` API; a context manager."""

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
