"""`TimeSplit`: where the wall time of a training loop goes (env stepping, inference, learning).
`InFlight`: how long k of several workers (env pools) were busy at once, for k = 0, 1, ...."""

from __future__ import annotations

import threading
from time import perf_counter, thread_time


class TimeSplit:
    """Accumulates wall seconds per named section: `with split("env"): ...`.

    Sections may nest, but then the inner time counts in both, and `fractions` (shares of the summed
    time) no longer split the wall time; keep the sections of one loop side by side. With
    `cpu=True` each section also sums the CPU seconds of the thread that timed it (`cpu_totals`):
    where those fall short of its wall seconds, the thread waited (for a lock, the GIL, a core,
    a device) rather than ran.
    """

    __slots__ = ("_cpu", "_name", "_sections", "_stack", "_totals")

    def __init__(self, sections: tuple[str, ...] = (), cpu: bool = False) -> None:
        self._sections = sections
        """Sections named up front: they read as 0 until timed (also after `reset`), and the
        totals' keys never change afterwards as another thread reads them."""
        self._totals: dict[str, float] = dict.fromkeys(sections, 0.0)
        self._cpu: dict[str, float] | None = dict.fromkeys(sections, 0.0) if cpu else None
        self._stack: list[tuple[str, float, float]] = []
        self._name = ""

    def __call__(self, name: str) -> TimeSplit:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._stack.append((self._name, perf_counter(), thread_time() if self._cpu is not None
                            else 0.0))  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        end = perf_counter()
        name, start, cpu = self._stack.pop()
        self._totals[name] = self._totals.get(name, 0.0) + end - start
        if self._cpu is not None:
            self._cpu[name] = self._cpu.get(name, 0.0) + thread_time() - cpu

    def add(self, name: str, seconds: float) -> None:
        """Add `seconds` measured elsewhere to section `name`."""
        self._totals[name] = self._totals.get(name, 0.0) + seconds

    def totals(self) -> dict[str, float]:
        """Seconds per section since the last `reset`."""
        return dict(self._totals)

    def totals_so_far(self) -> dict[str, float]:
        """`totals()` with the time so far of the sections still open: what another thread
        reads of a loop that may be inside a long section (waiting) as it reads."""
        now, out = perf_counter(), dict(self._totals)
        for name, start, _ in list(self._stack):
            out[name] = out.get(name, 0.0) + now - start
        return out

    def cpu_totals(self) -> dict[str, float]:
        """With `cpu=True`: the timing thread's CPU seconds per section since the last `reset`."""
        if self._cpu is None:
            raise ValueError("this TimeSplit does not time CPU seconds: make it with cpu=True")
        return dict(self._cpu)

    def fractions(self) -> dict[str, float]:
        """Each section's share of the summed time (all 0 when nothing was timed)."""
        total = sum(self._totals.values())
        return {k: (v / total if total > 0 else 0.0) for k, v in self._totals.items()}

    def reset(self) -> None:
        """Forget the accumulated times (a section still open keeps timing)."""
        self._totals = dict.fromkeys(self._sections, 0.0)
        if self._cpu is not None:
            self._cpu = dict.fromkeys(self._sections, 0.0)


class InFlight:
    """Wall seconds with k of several workers in flight at once, k = 0, 1, ...: each worker
    calls `start()` when it sends work and `stop()` when the work is back, from any thread;
    the clock runs between `open()` and `close()` (the workers all back by then)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._since: float | None = None
        self._seconds: list[float] = []

    def _move(self, delta: int, clock: bool | None = None) -> None:
        with self._lock:
            now = perf_counter()
            if self._since is not None:
                self._seconds += [0.0] * (self._count + 1 - len(self._seconds))
                self._seconds[self._count] += now - self._since
                self._since = now
            self._count += delta
            if self._count < 0:
                self._count = 0
                raise RuntimeError(
                    "InFlight.stop() with no worker in flight: open() the clock before any "
                    "worker is sent, and stop() each once after its start()"
                )
            if clock is not None:  # open: nothing in flight yet (whatever an error left)
                self._since, self._count = (now, 0) if clock else (None, self._count)

    def open(self) -> None:
        """Start the clock, with no worker in flight."""
        self._move(0, clock=True)

    def close(self) -> None:
        """Stop the clock (the time until the next `open` is not counted)."""
        self._move(0, clock=False)

    def start(self) -> None:
        """One more worker is in flight."""
        self._move(1)

    def stop(self) -> None:
        """One worker is back."""
        self._move(-1)

    def cpu_totals(self) -> dict[str, float]:
        """With `cpu=True`: the timing thread's CPU seconds per section since the last `reset`."""
        if self._cpu is None:
            raise ValueError("this TimeSplit does not time CPU seconds: make it with cpu=True")
        return dict(self._cpu)

    def fractions(self) -> list[float]:
        """The share of the clock's time with k workers in flight, at index k (empty before any
        time was counted)."""
        total = sum(self._seconds)
        return [s / total for s in self._seconds] if total > 0 else []

    def reset(self) -> None:
        """Forget the time counted (workers in flight stay counted)."""
        with self._lock:
            self._seconds = []
