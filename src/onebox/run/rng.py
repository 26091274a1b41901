"""Capture and restore the global random states: Python `random`, numpy's global RNG, torch's CPU
generator and, when CUDA is available, every CUDA device's generator."""

from __future__ import annotations

import random
from typing import Any

import numpy as np


def rng_state() -> dict[str, Any]:
    """The global RNG states, for a checkpoint; restore them with `set_rng_state`."""
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
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
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) != torch.cuda.device_count():
            raise ValueError(
                f"the RNG state has {len(cuda)} CUDA device(s) but this machine has "
                f"{torch.cuda.device_count()}; resume on the same number of GPUs"
            )
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
