"""Capture and restore the global random states: Python `random`, numpy's global RNG, torch's CPU
generator and, when CUDA is available, every CUDA device's generator, as plain data (numbers,
lists, tuples and tensors) that a weights-only checkpoint holds."""

from __future__ import annotations

import random
from typing import Any

import numpy as np


def rng_state() -> dict[str, Any]:
    """The global RNG states, for a checkpoint; restore them with `set_rng_state`."""
    import torch

    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (str(name), keys.tolist(), int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states captured by `rng_state`, so later draws repeat exactly."""
    import torch

    missing = {"python", "numpy", "torch"} - set(state)
    if missing:
        raise ValueError(
            f"RNG state lacks {', '.join(sorted(missing))}; pass the dict made by rng_state()"
        )
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) != torch.cuda.device_count():
            raise ValueError(
                f"the RNG state has {len(cuda)} CUDA device(s) but this machine has "
                f"{torch.cuda.device_count()}; resume on the same number of GPUs"
            )
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
