"""`TimeSplit`: where the wall time of a training loop goes (env stepping, inference, learning)."""

from __future__ import annotations

from time import perf_counter


class TimeSplit:
    """Accumulates wall seconds per named section: `with split("env"): ...`.

    Sections may nest, but then the inner time counts in both, and `fractions` (shares of the summed
    time) no longer split the wall time; keep the sections of one loop side by side.
    """

    __slots__ = ("_name", "_stack", "_totals")

    def __init__(self) -> None:
        self._totals: dict[str, float] = {}
        self._stack: list[tuple[str, float]] = []
        self._name = ""

    def __call__(self, name: str) -> TimeSplit:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._stack.append((self._name, perf_counter()))

    def __exit__(self, *exc: object) -> None:
        end = perf_counter()
        name, start = self._stack.pop()
        self._totals[name] = self._totals.get(name, 0.0) + end - start

    def add(self, name: str, seconds: float) -> None:
        """Add `seconds` measured elsewhere to section `name`."""
        self._totals[name] = self._totals.get(name, 0.0) + seconds

    def totals(self) -> dict[str, float]:
        """Seconds per section since the last `reset`."""
        return dict(self._totals)

    def fractions(self) -> dict[str, float]:
        """Each section's share of the summed time (all 0 when nothing was timed)."""
        total = sum(self._totals.values())
        return {k: (v / total if total > 0 else 0.0) for k, v in self._totals.items()}

    def reset(self) -> None:
        """Forget the accumulated times (a section still open keeps timing)."""
        self._totals = {}
