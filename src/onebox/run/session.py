"""`RunSession`: one run's folder, logs, progress bar, checkpoints, Ctrl-C, plots and resume
counters, for every training loop and for evolution.

    session = RunSession.open(config, resume, "ppo", resolve, keys=("agent", "iteration"))
    config = session.config                 # resolved; nothing written yet
    ...build envs and agent; on resume restore them from session.checkpoint...
    with session.start(lambda: {"agent": agent.state_dict(), "iteration": it},
                       total=config.total_steps):
        while session.step < config.total_steps and not session.stopping:
            ...one iteration: env steps, an update...
            session.episodes(step, returns, lengths)
            session.log(step, {**stats, **session.rates()})
            session.update(step)            # progress bar; a checkpoint when one is due

`open` resolves the config (raising on bad input before anything is written) and, to resume,
loads the last checkpoint and its counters: the step (`session.step`), the wall time so far and
the random number generators' state. `start` creates the run folder (a new run's) and writes the
resolved config there, restores the generators, and opens the logger, the checkpointer, the
progress bar and the Ctrl-C handler. When the `with` block ends normally (its loop done or
stopped by Ctrl-C) the session writes the final checkpoint, closes the logs and draws the
learning curve; when it ends with an exception it only closes the logs.

A checkpoint holds what the loop's `state` callback returns, plus the step, the elapsed time and
the generators' state. The callback runs at each save before the checkpoint is written, so it
may first write files of its own beside it (a replay buffer), which then never outlive it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from onebox.run.checkpoint import Checkpointer, load_checkpoint
from onebox.run.folder import new_run_dir, save_config
from onebox.run.logger import RETURN_TAG, Logger, import_wandb
from onebox.run.plots import plot_curves
from onebox.run.progress import Progress
from onebox.run.rng import rng_state, set_rng_state
from onebox.run.signals import GracefulInterrupt
from onebox.run.timing import TimeSplit

State = Callable[[], dict[str, Any]]
"""() -> the loop's own part of a checkpoint (its model, optimizer, counters)."""


class RunSession:
    """One run of a training loop or an evolution (see the module's docstring).

    `config` must be resolved (checked, presets filled) and have the fields of
    `onebox.run.config.RunConfig`; `resume` is the run folder to continue and `checkpoint` its
    last checkpoint, holding `step_key` (the step: env steps, or env frames for evolution) and
    `elapsed`. Makes nothing on disk: see `start`.
    """

    def __init__(
        self,
        config: Any,
        algo: str,
        *,
        resume: Path | None = None,
        checkpoint: dict[str, Any] | None = None,
        step_key: str = "global_step",
    ) -> None:
        if (resume is None) != (checkpoint is None):
            raise ValueError("a resumed session needs both its run folder and its checkpoint")
        if config.track:
            import_wandb()  # a missing wandb fails here, before the run folder
        self.config, self.algo, self.step_key = config, algo, step_key
        self.checkpoint = checkpoint
        """The checkpoint a resumed run continues from (None for a new run)."""
        self.step = int(checkpoint[step_key]) if checkpoint is not None else 0
        """The run's step: restored on resume, then set by `update`."""
        self.elapsed = float(checkpoint["elapsed"]) if checkpoint is not None else 0.0
        """Wall seconds of the run before this process (on resume)."""
        self.timer = TimeSplit()
        """Where the loop's wall time goes; `rates` logs its fractions."""
        self._run_dir = Path(resume) if resume is not None else None
        self._logger: Logger | None = None
        self._checkpointer: Checkpointer | None = None
        self._progress: Progress | None = None
        self._interrupt: GracefulInterrupt | None = None
        self._state: State | None = None
        self._start_step, self._start_time = self.step, time.perf_counter()

    @classmethod
    def open(
        cls,
        config: Any,
        resume: Path | None,
        algo: str,
        resolve: Callable[[Any], Any],
        keys: Sequence[str] = (),
    ) -> RunSession:
        """A new run of `resolve(config)` (ValueError on bad input, nothing written), or with
        `resume` the run in that folder: its stored `config` resolved again (it may have been
        edited) and its last checkpoint, which must hold the loop's `keys`."""
        config = resolve(config)
        checkpoint = None
        if resume is not None:
            checkpoint = load_checkpoint(Path(resume), keys=(*keys, "global_step", "elapsed"))
        return cls(config, algo, resume=resume, checkpoint=checkpoint)

    @property
    def run_dir(self) -> Path:
        """The run folder (a new run's exists once `start` made it)."""
        if self._run_dir is None:
            raise RuntimeError("a new run's folder is made by RunSession.start")
        return self._run_dir

    @property
    def logger(self) -> Logger:
        if self._logger is None:
            raise RuntimeError("the logger is opened by RunSession.start")
        return self._logger

    @property
    def stopping(self) -> bool:
        """Whether Ctrl-C (or SIGTERM) asked the run to stop (it then saves and ends)."""
        return self._interrupt is not None and self._interrupt.requested

    @contextlib.contextmanager
    def start(
        self,
        state: State,
        *,
        total: int,
        progress: int | None = None,
        description: str | None = None,
        curve: str | None = RETURN_TAG,
        members: int | None = None,
    ) -> Iterator[RunSession]:
        """Run the loop inside: the folder made and the config written, the generators
        restored (on resume), the logs (a population's of `members` members, see `Logger`),
        checkpoints, progress bar (`total` steps, starting at `progress`, default `step`) and
        Ctrl-C handled; at a normal end the final checkpoint and the curve of `curve`
        (`curve.png`; None: the loop draws its own)."""
        if self._run_dir is None:
            self._run_dir = new_run_dir(self.config.runs_dir, self.config.name,
                                        env_id=self.config.env, algo=self.algo,
                                        seed=self.config.seed)  # fmt: skip
        save_config(self._run_dir, self.config)
        if self.checkpoint is not None and "rng" in self.checkpoint:
            set_rng_state(self.checkpoint["rng"])
        self._state = state
        config, start = self.config, self.step if progress is None else progress
        with contextlib.ExitStack() as stack:
            self._logger = stack.enter_context(
                Logger(
                    self._run_dir,
                    start_step=self.step,
                    elapsed=self.elapsed,
                    track=config.track,
                    project=config.wandb_project,
                    config=config,
                    members=members,
                )
            )
            self._checkpointer = Checkpointer(self._run_dir, config.checkpoint_minutes)
            self._progress = stack.enter_context(
                Progress(
                    total,
                    start_step=min(start, total),
                    enabled=config.progress,
                    description=description or f"{self.algo} {config.env}",
                )
            )
            self._interrupt = stack.enter_context(GracefulInterrupt())
            self._start_step, self._start_time = self.step, time.perf_counter()
            yield self
            self.save()  # not on an exception: the last checkpoint stays the last good one
        if curve is not None:
            plot_curves(self._run_dir, tag=curve)

    def update(self, step: int, *, progress: int | None = None, shown: float | None = None) -> None:
        """After each iteration: the run is at `step`; the progress bar moves to `progress`
        (default `step`) showing `shown` (default the mean of the recent returns), and a
        checkpoint is saved when one is due."""
        self.step = step
        assert self._progress is not None and self._checkpointer is not None
        bar = step if progress is None else progress
        self._progress.update(min(bar, self._progress.total_steps),
                              self.logger.recent_return if shown is None else shown)  # fmt: skip
        if self._checkpointer.due():
            self.save()

    def save(self) -> None:
        """Write a checkpoint now: the logs up to it flushed first, so that they survive a kill
        as it does."""
        assert self._checkpointer is not None and self._state is not None
        self.logger.flush()
        state = self._state()  # may write files beside the checkpoint: before it
        self._checkpointer.save({**state, self.step_key: self.step,
                                 "elapsed": self.logger.elapsed(), "rng": rng_state()})  # fmt: skip

    def episodes(self, step: int, returns: Sequence[float], lengths: Sequence[int]) -> None:
        """Log finished episodes (nothing when there are none)."""
        if len(returns):
            self.logger.episodes(step, returns, lengths)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Log scalars at `step`."""
        self.logger.scalars(step, scalars)

    def rates(self, step: int | None = None) -> dict[str, float]:
        """`charts/SPS` (steps per second since `start`, up to `step`, default the session's)
        and the share of each section of `timer` (`time/...`)."""
        done = (self.step if step is None else step) - self._start_step
        sps = done / max(time.perf_counter() - self._start_time, 1e-9)
        return {"charts/SPS": sps, **{f"time/{k}": v for k, v in self.timer.fractions().items()}}
