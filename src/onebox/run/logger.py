"""Metrics of a run: TensorBoard scalars, the same in `metrics.csv`, and optionally Weights & Biases.

`metrics.csv` is in long format, one scalar per row: `step,time,tag,value`, where `time` is the wall
seconds since the run began (continuing across resumes). A resumed run first drops the rows after its
checkpoint's step, since it redoes those steps.

A population's run (`members=N`) has a member column, `step,time,member,tag,value` (empty for the
population's own scalars), and one TensorBoard folder per member, `members/<i>`, so that
TensorBoard draws the members' curves side by side.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import math
import os
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

CSV_FILE = "metrics.csv"
LOG_FILE = "log.txt"
CSV_HEADER = ("step", "time", "tag", "value")
POPULATION_HEADER = ("step", "time", "member", "tag", "value")
MEMBERS_DIR = "members"
"""A population's per-member TensorBoard folders: `members/0`, `members/1`, ..."""
RETURN_TAG = "charts/episodic_return"
LENGTH_TAG = "charts/episodic_length"
WINDOW = 100
"""Finished episodes kept for `Logger.recent_returns`."""
RECENT = 20
"""Episodes averaged by `Logger.recent_return`."""
CSV_FLUSH_SECONDS = 5.0

T = TypeVar("T", int, float)


class Logger:
    """Writes scalars to TensorBoard (`run_dir`), `run_dir/"metrics.csv"` and, with `track`, W&B.

    Resuming: pass the checkpoint's `start_step` and `elapsed` (from `Logger.elapsed()` when it was
    saved); TensorBoard and the CSV both drop what was logged at steps after `start_step` (what was
    logged at `start_step` itself, before the checkpoint was saved, stays).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        start_step: int = 0,
        elapsed: float = 0.0,
        track: bool = False,
        project: str = "onebox",
        config: Any = None,
        members: int | None = None,
    ) -> None:
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        if not math.isfinite(elapsed) or elapsed < 0:
            raise ValueError(f"elapsed must be a finite number of seconds >= 0, got {elapsed}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._elapsed0 = float(elapsed)
        self._t0 = time.perf_counter()
        self._returns: collections.deque[float] = collections.deque(maxlen=WINDOW)
        wandb = import_wandb() if track else None  # a missing wandb fails before any file is made

        self._csv_path = self.run_dir / CSV_FILE
        # the window of recent returns continues from the episodes logged before the checkpoint
        self._header = CSV_HEADER if members is None else POPULATION_HEADER
        self._returns.extend(_truncate_csv(self._csv_path, start_step, self._header))
        new = not self._csv_path.exists() or self._csv_path.stat().st_size == 0
        self._csv_file = open(self._csv_path, "a", newline="", buffering=1 << 16)  # noqa: SIM115
        self._csv = csv.writer(self._csv_file, lineterminator="\n")
        if new:
            self._csv.writerow(self._header)
        self._last_flush = self._t0

        from torch.utils.tensorboard import SummaryWriter

        def writer(folder: Path) -> SummaryWriter:
            # TensorBoard purges events at steps >= purge_step; the CSV keeps step == start_step
            purge = start_step + 1 if start_step > 0 else None
            return SummaryWriter(log_dir=str(folder), purge_step=purge, flush_secs=10)

        self._tb = writer(self.run_dir)
        self._member_tb = [writer(self.run_dir / MEMBERS_DIR / str(i)) for i in range(members or 0)]
        self._wandb = None if wandb is None else _init_wandb(wandb, self.run_dir, project, config)
        self._closed = False

    def scalars(self, step: int, values: Mapping[str, float], member: int | None = None) -> None:
        """Log each `tag: value` of `values` at env step `step` (a population's: of `member`,
        or of the population as a whole)."""
        self._check_open()
        now = self.elapsed()
        step = int(step)
        floats = {tag: float(value) for tag, value in values.items()}
        self._tb_write(step, floats.items(), member)
        for tag, value in floats.items():
            self._csv.writerow(self._row(step, now, member, tag, value))
        if self._wandb is not None and floats:
            self._wandb.log(floats, step=step)
        self._maybe_flush()

    def note(self, step: int, text: str) -> None:
        """A line for the user: printed to stderr, kept in `run_dir/"log.txt"` and in
        TensorBoard's text tab (tag `notes`)."""
        self._check_open()
        line = f"step {int(step)}: {text}"
        print(line, file=sys.stderr)
        with open(self.run_dir / LOG_FILE, "a") as f:
            f.write(line + "\n")
        self._tb.add_text("notes", text, int(step))

    def episodes(
        self,
        step: int,
        returns: Sequence[float] | np.ndarray,
        lengths: Sequence[int] | np.ndarray,
        member: int | None = None,
    ) -> None:
        """Log each finished episode's return and length at `step` (`charts/episodic_*`; a
        population's: `member`'s).

        TensorBoard and the CSV get every episode; W&B, which keeps one value per tag and step,
        gets their means.
        """
        self._check_open()
        returns = np.asarray(returns, dtype=np.float64).reshape(-1)
        lengths = np.asarray(lengths).reshape(-1)
        if returns.shape != lengths.shape:
            raise ValueError(
                f"episodes: {returns.size} returns but {lengths.size} lengths; pass one of each "
                "per finished episode"
            )
        now = self.elapsed()
        step = int(step)
        pairs = []
        for ret, length in zip(returns.tolist(), lengths.tolist(), strict=True):
            pairs += ((RETURN_TAG, ret), (LENGTH_TAG, float(length)))
            self._csv.writerow(self._row(step, now, member, RETURN_TAG, ret))
            self._csv.writerow(self._row(step, now, member, LENGTH_TAG, length))
        self._tb_write(step, pairs, member)
        if self._wandb is not None and returns.size:  # W&B keeps one value per tag and step
            self._wandb.log(
                {RETURN_TAG: float(returns.mean()), LENGTH_TAG: float(lengths.mean())}, step=step
            )
        self._returns.extend(returns.tolist())
        self._maybe_flush()

    @property
    def recent_return(self) -> float | None:
        """Mean return of the last 20 finished episodes; None before the first one."""
        if not self._returns:
            return None
        recent = list(self._returns)[-RECENT:]
        return sum(recent) / len(recent)

    @property
    def recent_returns(self) -> list[float]:
        """Returns of the last 100 finished episodes, oldest first."""
        return list(self._returns)

    def elapsed(self) -> float:
        """Wall seconds since the run began, including the time before a resume."""
        return self._elapsed0 + time.perf_counter() - self._t0

    def flush(self) -> None:
        """Write everything buffered to disk."""
        if self._closed:
            return
        self._csv_file.flush()
        for tb in (self._tb, *self._member_tb):
            tb.flush()
        self._last_flush = time.perf_counter()

    def close(self) -> None:
        """Flush and close every writer (W&B too). Calling it again does nothing."""
        if self._closed:
            return
        self.flush()
        self._csv_file.close()
        for tb in (self._tb, *self._member_tb):
            tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        self._closed = True

    def __enter__(self) -> Logger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _row(self, step: int, now: float, member: int | None, tag: str, value: float) -> tuple:
        """A CSV row (with the member column in a population's file)."""
        if member is not None and not self._member_tb:
            raise ValueError(f"member {member} logged to a Logger made without members")
        head = (step, f"{now:.3f}")
        if len(self._header) == len(POPULATION_HEADER):
            head += ("" if member is None else member,)
        return (*head, tag, repr(float(value)))

    def _tb_write(
        self, step: int, pairs: Iterable[tuple[str, float]], member: int | None = None
    ) -> None:
        """All `(tag, value)` pairs of one step as one TensorBoard event: one hand-off to the
        writer thread instead of one per value (`add_scalar` costs ~60 us each)."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in pairs]
        tb = self._tb if member is None else self._member_tb[member]
        if values:
            tb._get_file_writer().add_summary(Summary(value=values), step)

    def _maybe_flush(self) -> None:
        if time.perf_counter() - self._last_flush >= CSV_FLUSH_SECONDS:
            self._csv_file.flush()
            self._last_flush = time.perf_counter()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Logger is closed; make a new one to log more")


def _truncate_csv(path: Path, start_step: int, expected: tuple[str, ...]) -> list[float]:
    """Drop the rows of `path` (whose header must be `expected`) after `start_step`, and any row
    cut short by a crash; return the episodic returns kept, oldest first."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    with open(path, newline="") as f:
        text = f.read()
    lines = text.split("\n")
    header = next(csv.reader(lines[:1]), None)
    if tuple(header or ()) != expected:
        raise ValueError(
            f"{path} does not start with the header {','.join(expected)}; it is not the "
            "metrics file of a run like this one (move it away to resume this run)"
        )
    if not text.endswith("\n"):
        lines = lines[:-1]  # the last row was being written when the process died
    kept, returns = [lines[0]], []
    for line in lines[1:]:
        row = next(csv.reader([line]), [])
        step, value = (
            (_number(int, row[0]), _number(float, row[-1]))
            if len(row) == len(expected)
            else (None, None)
        )
        if step is not None and value is not None and step <= start_step:
            kept.append(line)
            if row[-2] == RETURN_TAG:
                returns.append(value)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        f.write("\n".join(kept) + "\n")
    os.replace(tmp, path)
    return returns


def _number(kind: type[T], text: str) -> T | None:
    try:
        return kind(text)
    except ValueError:
        return None


def import_wandb() -> Any:
    """The `wandb` module; ValueError (bad input: `--track`) if it is not installed."""
    try:
        import wandb
    except ImportError:
        raise ValueError("--track needs Weights & Biases: pip install wandb") from None
    return wandb


def _init_wandb(wandb: Any, run_dir: Path, project: str, config: Any) -> Any:
    """Start (or, for a resumed run folder, continue) the W&B run of `run_dir`."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    id_file = run_dir / "wandb_id.txt"
    if id_file.is_file():
        run_id = id_file.read_text().strip()
    else:
        run_id = uuid.uuid4().hex[:16]
        id_file.write_text(run_id + "\n")
    return wandb.init(
        project=project,
        config=config,
        dir=str(run_dir),
        name=run_dir.name,
        resume="allow",
        id=run_id,
    )
