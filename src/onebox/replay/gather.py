"""Rows of a large array gathered by index in C++ with prefetching (`onebox._replay.take_rows`):
random rows of a table much larger than the caches are a chain of cache and TLB misses, which
prefetching overlaps."""

from __future__ import annotations

import numpy as np

from onebox import _replay


def take(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`array[rows]` for a C-contiguous `array` (any dtype, structured ones included)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
    out = np.empty((len(rows), *array.shape[1:]), dtype=array.dtype)
    if len(rows):
        row_bytes = out.nbytes // len(rows)
        _replay.take_rows(
            array.reshape(-1).view(np.uint8).reshape(len(array), row_bytes),
            rows,
            out.reshape(-1).view(np.uint8).reshape(len(rows), row_bytes),
        )
    return out
