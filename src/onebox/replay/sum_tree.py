"""A sum tree with a min tree beside it, vectorised in numpy over batches of leaves.

Leaves hold non-negative priorities; the sum tree answers prefix-sum queries (proportional
sampling) and the min tree gives the smallest positive priority (the largest importance weight).
Both are complete binary trees in flat arrays: node i has children 2i and 2i+1, the leaves sit at
[size, 2 * size). Every operation works on a whole batch one tree level at a time (about 20 numpy
calls at a million leaves), never a Python loop per item. Parents are recomputed from their
children on each update rather than adjusted by differences, so sums never drift.
"""

from __future__ import annotations

import numpy as np

from onebox.replay.persist import load_into


class SumTree:
    """Priorities of `capacity` leaves, all zero at first (a zero leaf is never sampled)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a sum tree needs capacity >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.size = 1 << max(0, (self.capacity - 1).bit_length())
        self.depth = self.size.bit_length() - 1
        self.sums = np.zeros(2 * self.size, dtype=np.float64)
        self.mins = np.full(2 * self.size, np.inf, dtype=np.float64)

    @property
    def total(self) -> float:
        """The sum of all priorities."""
        return float(self.sums[1])

    @property
    def min(self) -> float:
        """The smallest positive priority (inf when all are zero)."""
        return float(self.mins[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        """The priorities of the leaves `indices`."""
        return self.sums[self.size + np.asarray(indices, dtype=np.int64)]

    def set(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaves to priorities (>= 0, finite; zero removes a leaf from sampling). A leaf
        repeated in `indices` takes its last value."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        p = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if idx.shape != p.shape:
            raise ValueError(f"{idx.size} indices but {p.size} priorities")
        if idx.size == 0:
            return
        if idx.min() < 0 or idx.max() >= self.capacity:
            raise IndexError(f"leaf indices must be in [0, {self.capacity})")
        if not np.all(np.isfinite(p)) or p.min() < 0:
            raise ValueError("priorities must be finite and >= 0")
        node = idx + self.size
        self.sums[node] = p
        self.mins[node] = np.where(p > 0, p, np.inf)
        for _ in range(self.depth):
            node = node >> 1
            left = 2 * node
            self.sums[node] = self.sums[left] + self.sums[left + 1]
            self.mins[node] = np.minimum(self.mins[left], self.mins[left + 1])

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target mass u in [0, total), the leaf i with prefix(i) <= u < prefix(i + 1),
        where prefix(i) is the sum of the leaves before i. Never returns a zero leaf while the
        total is positive (a target at or past the total, from rounding, gives the last positive
        leaf)."""
        u = np.array(targets, dtype=np.float64).reshape(-1)
        node = np.ones(u.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * node
            left_sum = self.sums[left]
            right = (u >= left_sum) & (self.sums[left + 1] > 0)
            u -= np.where(right, left_sum, 0.0)
            node = left + right
        return node - self.size

    def sample_stratified(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """`batch_size` leaves drawn in proportion to their priorities, one uniform draw in each
        of `batch_size` equal segments of the total (Schaul et al. 2016, appendix B.2.1)."""
        total = self.total
        if not total > 0:
            raise ValueError("cannot sample: every priority is zero (the table is empty)")
        u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        return self.find(u)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"sums": self.sums, "mins": self.mins}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        load_into(self.state_dict(), state, "sum tree")
