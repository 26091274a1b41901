"""Checks of the arrays handed to a replay table: a wrong shape or dtype is a clear error."""

from __future__ import annotations

from typing import Any

import numpy as np


def as_batch(name: str, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """`value` as an array of exactly `shape` and `dtype`.

    Integer or float data of another width is converted when the kind matches (int64 actions into
    an int32 table, float64 rewards into float32); anything else is an error.
    """
    arr = np.asarray(value)
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (one row per env), got {arr.shape}")
    if arr.dtype != dtype:
        kinds = {"b": "b", "i": "iu", "u": "iu", "f": "fiu"}
        if arr.dtype.kind not in kinds.get(dtype.kind, dtype.kind):
            raise TypeError(f"{name} must have dtype {dtype}, got {arr.dtype}")
        arr = arr.astype(dtype)
    return arr


def check_obs(name: str, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Observations: exact shape and dtype (a converted image would silently lose data)."""
    arr = np.asarray(value)
    if arr.shape != shape or arr.dtype != dtype:
        raise ValueError(
            f"{name} must be {dtype} of shape {shape} (one row per env), "
            f"got {arr.dtype} of shape {arr.shape}"
        )
    return arr


def check_flags(name: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Terminated/truncated flags: booleans of `shape` (one per env, or per step and env)."""
    arr = np.asarray(value)
    if arr.shape != shape or arr.dtype != np.bool_:
        raise ValueError(
            f"{name} must be a bool array of shape {shape}, got {arr.dtype} {arr.shape}"
        )
    return arr


def check_envs(envs: Any, num_envs: int) -> np.ndarray:
    """`add`'s env ids: all `num_envs` envs (None), or increasing ids within range."""
    if envs is None:
        return np.arange(num_envs)
    rows = np.asarray(envs)
    if (
        rows.ndim != 1 or rows.dtype.kind not in "iu" or not len(rows)
        or rows[0] < 0 or rows[-1] >= num_envs or np.any(np.diff(rows) <= 0)
    ):  # fmt: skip
        raise ValueError(f"envs must be increasing env ids in [0, {num_envs}), got {envs!r}")
    return rows.astype(np.int64, copy=False)
