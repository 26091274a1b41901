"""Proportional prioritization (Schaul et al. 2016) over a table's slots: priorities raised to
alpha in a sum tree, new items at the largest priority seen so far, importance weights with beta
annealed linearly to 1, normalised by the largest weight in the table."""

from __future__ import annotations

import numpy as np

from onebox.replay.sum_tree import SumTree


def check_priority_args(alpha: float, beta: float, beta_steps: int, eps: float) -> None:
    """Raise ValueError naming the argument that is out of range."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(
            f"alpha must be in [0, 1] (0: uniform, 1: fully proportional), got {alpha}"
        )
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (it is annealed up to 1), got {beta}")
    if beta_steps < 1:
        raise ValueError(
            f"beta_steps must be >= 1 (samples over which beta reaches 1), got {beta_steps}"
        )
    if not eps > 0:
        raise ValueError(f"eps must be > 0 (it keeps every priority positive), got {eps}")


class Priorities:
    """The priorities of `capacity` slots.

    A priority given by the caller is a TD-error magnitude d; the slot gets (|d| + eps) ** alpha.
    `beta` is beta0 + (1 - beta0) * min(1, samples / beta_steps), where `samples` counts the
    calls to `sample`.
    """

    def __init__(self, capacity: int, alpha: float, beta: float, beta_steps: int, eps: float):
        check_priority_args(alpha, beta, beta_steps, eps)
        self.tree = SumTree(capacity)
        self.alpha = float(alpha)
        self.beta0 = float(beta)
        self.beta_steps = int(beta_steps)
        self.eps = float(eps)
        self.max_priority = 1.0  # the largest |d| + eps seen (before alpha)
        self.samples = 0

    @property
    def beta(self) -> float:
        """The beta the next `sample` uses."""
        return self.beta0 + (1.0 - self.beta0) * min(1.0, self.samples / self.beta_steps)

    def _raw(self, td: np.ndarray, count: int) -> np.ndarray:
        d = np.abs(np.asarray(td, dtype=np.float64)) + self.eps
        if d.shape != (count,):
            raise ValueError(f"priorities must have shape ({count},), got {d.shape}")
        if count and not np.isfinite(d.max()):
            raise ValueError("priorities must be finite (got NaN or inf: check the TD errors)")
        return d

    def add(self, slots: np.ndarray, td: np.ndarray | None = None) -> None:
        """New items in `slots`: priority from `td` where given and not NaN, else the max seen."""
        if td is None or np.isnan(td).all():
            self.tree.set(slots, np.full(len(slots), self.max_priority**self.alpha))
            return
        given = ~np.isnan(td)
        raw = np.empty(len(slots))
        raw[given] = self._raw(td[given], int(given.sum()))
        self.max_priority = max(self.max_priority, float(raw[given].max()))
        raw[~given] = self.max_priority
        self.tree.set(slots, raw**self.alpha)

    def remove(self, slots: np.ndarray) -> None:
        """Slots that no longer hold an item are never sampled."""
        self.tree.set(slots, np.zeros(len(slots)))

    def update(self, slots: np.ndarray, td: np.ndarray) -> None:
        """Set the priorities of sampled slots from their new TD errors (slots emptied since they
        were sampled are left empty)."""
        raw = self._raw(td, len(slots))
        # A slot emptied since it was sampled (its frames overwritten) stays empty.
        self.tree.set(slots, raw**self.alpha, skip_empty=True)
        if len(slots):
            self.max_priority = max(self.max_priority, float(raw.max()))

    def sample(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Stratified proportional draw: (slots, importance weights (float32, max 1))."""
        slots, p = self.tree.sample_stratified(batch_size, rng)
        weights = (p / self.tree.min) ** (-self.beta)
        self.samples += 1
        return slots, weights.astype(np.float32)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            **{f"tree.{k}": v for k, v in self.tree.state_dict().items()},
            "max_priority": np.array(self.max_priority),
            "samples": np.array(self.samples),
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.tree.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("tree.")})
        self.max_priority = float(state["max_priority"])
        self.samples = int(state["samples"])
