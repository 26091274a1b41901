"""`Progress`: a rich progress bar on stderr with steps, SPS, recent return and ETA."""

from __future__ import annotations

import sys
from time import perf_counter
from typing import Any

REFRESH_SECONDS = 0.25
"""`update` redraws at most this often."""


class Progress:
    """A progress bar for a run of `total_steps` env steps, resumed at `start_step`.

    SPS counts only the steps done by this process (not the resumed ones); ETA is the remaining
    steps at that rate. `enabled=None` shows the bar only when stderr is a terminal; a disabled bar
    costs one attribute check per `update`.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        start_step: int = 0,
        enabled: bool | None = None,
        description: str = "",
    ) -> None:
        if total_steps <= 0:
            raise ValueError(f"total_steps must be > 0, got {total_steps}")
        if not 0 <= start_step <= total_steps:
            raise ValueError(
                f"start_step must be in [0, total_steps={total_steps}], got {start_step}"
            )
        self.total_steps = int(total_steps)
        self.start_step = int(start_step)
        self.enabled = sys.stderr.isatty() if enabled is None else bool(enabled)
        self._step = self.start_step
        self._return: float | None = None
        self._t0 = perf_counter()
        self._last_draw = -float("inf")
        self._bar: Any = None
        if self.enabled:
            self._start(description)

    def update(self, step: int, recent_return: float | None = None) -> None:
        """Record that `step` env steps are done (redraws at most every 0.25 s)."""
        if self._bar is None:
            return
        self._step = step
        self._return = recent_return
        now = perf_counter()
        if now - self._last_draw >= REFRESH_SECONDS:
            self._last_draw = now
            self._draw(now)

    def close(self) -> None:
        """Draw the last state and stop the bar. Calling it again does nothing."""
        if self._bar is None:
            return
        self._draw(perf_counter())
        self._bar.stop()
        self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, description: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[sps]} SPS"),
            TextColumn("return {task.fields[ret]}"),
            TextColumn("ETA {task.fields[eta]}"),
            console=Console(stderr=True),
            auto_refresh=False,
        )
        self._task = self._bar.add_task(
            description,
            total=self.total_steps,
            completed=self.start_step,
            sps="-",
            ret="-",
            eta="-",
        )
        self._bar.start()

    def _draw(self, now: float) -> None:
        seconds = now - self._t0
        done = self._step - self.start_step
        sps = done / seconds if seconds > 0 and done > 0 else 0.0
        remaining = max(self.total_steps - self._step, 0)
        eta = _clock(remaining / sps) if sps > 0 else ("0:00:00" if remaining == 0 else "-")
        ret = "-" if self._return is None else f"{self._return:.2f}"
        self._bar.update(
            self._task, completed=self._step, sps=f"{sps:,.0f}", ret=ret, eta=eta, refresh=True
        )


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
