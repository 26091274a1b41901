"""A sum tree with a min tree beside it, vectorised in numpy over batches of leaves.

Leaves hold non-negative priorities; the sum tree answers prefix-sum queries (proportional
sampling) and the min tree gives the smallest positive priority (the largest importance weight).
Both are complete binary trees in flat numpy arrays: node i has children 2i and 2i+1, the leaves
sit at [size, 2 * size). Batch updates and batch searches run in C++ (`onebox._replay`,
csrc/replay/batch_ops.h), one tree level at a time over the batch; this class checks the
arguments. Parents are recomputed from their children on each update rather than adjusted by
differences, so sums never drift.
"""

from __future__ import annotations

import numpy as np

from onebox import _replay
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

    def set(self, indices: np.ndarray, priorities: np.ndarray, skip_empty: bool = False) -> None:
        """Set leaves to priorities (>= 0, finite; zero removes a leaf from sampling). A leaf
        repeated in `indices` takes its last value. With `skip_empty`, leaves that are zero stay
        zero. Raises IndexError or ValueError (nothing changed) on a bad index or priority."""
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        p = np.ascontiguousarray(priorities, dtype=np.float64).reshape(-1)
        if idx.shape != p.shape:
            raise ValueError(f"{idx.size} indices but {p.size} priorities")
        _replay.tree_set(self.sums, self.mins, idx, p, self.capacity, skip_empty)

    def find(self, targets: np.ndarray) -> np.ndarray:
        """For each target mass u in [0, total), the leaf i with prefix(i) <= u < prefix(i + 1),
        where prefix(i) is the sum of the leaves before i. Never returns a zero leaf while the
        total is positive (a target at or past the total, from rounding, gives the last positive
        leaf)."""
        return self.find_with_priorities(targets)[0]

    def find_with_priorities(self, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`find`, with the priorities of the leaves found."""
        u = np.ascontiguousarray(targets, dtype=np.float64).reshape(-1)
        leaf = np.empty(u.shape, dtype=np.int64)
        priority = np.empty(u.shape, dtype=np.float64)
        _replay.tree_find(self.sums, u, leaf, priority)
        return leaf, priority

    def sample_stratified(
        self, batch_size: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """`batch_size` leaves drawn in proportion to their priorities, one uniform draw in each
        of `batch_size` equal segments of the total (Schaul et al. 2016, appendix B.2.1): (leaves,
        their priorities)."""
        total = self.total
        if not total > 0:
            raise ValueError("cannot sample: every priority is zero (the table is empty)")
        u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        return self.find_with_priorities(u)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"sums": self.sums, "mins": self.mins}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        load_into(self.state_dict(), state, "sum tree")
