"""Saving a replay table as one .npz file of plain arrays (no pickle), and its RNG with it."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np


def rng_state(rng: np.random.Generator) -> np.ndarray:
    """The generator's state as a JSON string array."""
    return np.array(json.dumps(rng.bit_generator.state))


def set_rng_state(rng: np.random.Generator, state: np.ndarray) -> None:
    rng.bit_generator.state = json.loads(str(state))


def config_array(config: dict[str, Any]) -> np.ndarray:
    return np.array(json.dumps(config, sort_keys=True))


SAMPLING_ARGS = ("beta", "beta_steps")
"""Arguments of how a table samples, not of what it holds: a state loads into a table built with
other values of them (a resumed run made longer anneals its importance-sampling exponent over
its new length)."""


def check_config(kind: str, config: dict[str, Any], saved: np.ndarray) -> None:
    """A state loads only into a table built with the same arguments (but `SAMPLING_ARGS`)."""
    saved_config = json.loads(str(saved))
    mine = json.loads(json.dumps(config, sort_keys=True))
    diff = sorted(k for k in mine if k not in SAMPLING_ARGS and saved_config.get(k) != mine[k])
    if diff:
        raise ValueError(
            f"this {kind} state was saved from a table with other arguments ({', '.join(diff)}): "
            f"saved {saved_config}"
        )


def load_into(arrays: dict[str, np.ndarray], state: dict[str, np.ndarray], kind: str) -> None:
    """Copy `state` into `arrays` in place, shapes checked."""
    missing = sorted(set(arrays) - set(state))
    if missing:
        raise ValueError(f"the {kind} state lacks {', '.join(missing)}")
    for name, value in arrays.items():
        if np.shape(state[name]) != value.shape:
            raise ValueError(
                f"{kind} state {name} has shape {np.shape(state[name])}, not {value.shape}"
            )
        value[...] = state[name]


def save_npz(path: str | os.PathLike[str], state: dict[str, np.ndarray]) -> None:
    """Write atomically (a temporary file renamed over `path`)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp.npz"
    np.savez(tmp, **state)
    os.replace(tmp, path)


def load_npz(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    with np.load(os.fspath(path), allow_pickle=False) as f:
        return {name: f[name] for name in f.files}
