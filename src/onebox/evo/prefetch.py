"""Making a slot group's parameters ahead of its slots, on a thread of its own.

A slot group starts its queued (individual, episode) pairs in queue order, each with its
individual's flat parameters from the caller's parameter function. Those can cost more CPU than
the episode's inference: a GA child is its parent plus Gaussian noise, and a Nature CNN's 1.7M
normal draws take 10-30 ms of one core. Made when a slot comes free, that time would stall the
group's envs (an Atari group's pool steps all its envs together). `Prefetch` makes them on a
helper thread instead, in queue order, up to `ahead` rows before they are needed, so the work runs
beside the group's stepping and inference; the group waits only for rows not made yet. The rows
are the same as made on demand: the function sees the same indices in the same order, so
fitnesses do not change. torch releases the GIL in its kernels, so the helper runs on a core of
its own.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import numpy as np
import torch

from onebox.nn.accel import inherit_torch_threads

AHEAD_BYTES = 1 << 30
"""At most this many bytes of rows are made ahead per group."""


class Prefetch:
    """The rows `params(owners[i:i + 1])[0]` for i = 0, 1, ..., made ahead on a helper thread.

    Args:
        params: individual indices -> their (n, num_params) parameter rows. It may be called
            from two helper threads at once (one per slot group).
        owners: the individual of each queued pair, in the order the rows are taken.
        ahead: rows made ahead at most (fewer where they would take over `AHEAD_BYTES`).
        row_bytes: the bytes of one row.
        name: the helper thread's name.
    """

    def __init__(
        self,
        params: Callable[[np.ndarray], torch.Tensor],
        owners: np.ndarray,
        ahead: int,
        row_bytes: int,
        name: str,
    ) -> None:
        self._params, self._owners = params, owners
        self._rows: queue.Queue = queue.Queue()
        self._room = threading.Semaphore(max(1, min(ahead, AHEAD_BYTES // max(1, row_bytes))))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        inherit_torch_threads()
        try:
            for i in range(len(self._owners)):
                row = torch.as_tensor(self._params(self._owners[i : i + 1]))[0]
                while not self._room.acquire(timeout=0.1):
                    if self._stop.is_set():
                        return
                self._rows.put(row)
        except BaseException as e:  # re-raised in the group's thread by `take`
            self._rows.put(e)

    def take(self, n: int) -> torch.Tensor:
        """The next `n` rows as one (n, num_params) tensor, waiting for any not made yet; raises
        what the parameter function raised."""
        rows = []
        for _ in range(n):
            item = self._rows.get()
            if isinstance(item, BaseException):
                raise item
            self._room.release()
            rows.append(item)
        if rows and rows[0].is_cuda:  # made on the default stream by the helper: the calling
            # thread's stream (a slot group's own) waits for them, and their memory is not
            # reused before it has read them
            here = torch.cuda.current_stream(rows[0].device)
            here.wait_stream(torch.cuda.default_stream(rows[0].device))
            for row in rows:
                row.record_stream(here)
        return torch.stack(rows)

    def close(self) -> None:
        """Stop the helper (rows not taken are dropped)."""
        self._stop.set()
        self._thread.join()
