"""A recurrent policy's (h, c) state per env, for whoever runs one policy for many envs: the
inference server keeps one `EnvStates` per actor, an actor's own `LocalPolicy` one for its envs."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class EnvStates:
    """One actor's recurrent state: an (h, c) pair of size `size` per env (by env id, grown on
    demand, zeros for an env never seen), zeroed where an env's observation starts an episode.
    The inference server keeps one per actor; an actor-side `LocalPolicy` its own."""

    def __init__(self, size: int, device: torch.device | str) -> None:
        self.size, self.device = size, torch.device(device)
        self.h = torch.zeros(0, size, device=self.device)
        self.c = torch.zeros(0, size, device=self.device)

    def before(self, env_ids: np.ndarray, starts: np.ndarray | None) -> tuple[torch.Tensor, Any]:
        """The rows of envs `env_ids` (as an index tensor) and their (h, c) for this step,
        zeroed first where `starts[i]` (env i's observation begins an episode; None: none)."""
        top = int(np.max(env_ids, initial=-1)) + 1
        if len(self.h) < top:
            size = max(top, 2 * len(self.h))
            h, c = (torch.zeros(size, self.size, device=self.device) for _ in range(2))
            h[: len(self.h)], c[: len(self.c)] = self.h, self.c
            self.h, self.c = h, c
        ids = torch.as_tensor(env_ids, device=self.device)
        if starts is not None and starts.any():
            ended = ids[torch.as_tensor(starts, device=self.device)]
            self.h[ended], self.c[ended] = 0.0, 0.0
        return ids, (self.h[ids], self.c[ids])

    def after(self, ids: torch.Tensor, state: Any) -> None:
        """Keep (h, c), the state the policy reached, for the envs of `before`'s `ids`."""
        self.h[ids], self.c[ids] = state
