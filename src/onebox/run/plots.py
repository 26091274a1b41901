"""`plot_curves`: the learning curve of a run, from its `metrics.csv`, as a PNG."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from onebox.run.logger import CSV_FILE, RETURN_TAG

CURVE_FILE = "curve.png"


def plot_curves(run_dir: Path, tag: str = RETURN_TAG, out: Path | None = None) -> Path | None:
    """Draw `tag` against env steps and against wall time, side by side; return the PNG's path.

    Raw points are drawn faint with a trailing moving average over them. Writes
    `run_dir/"curve.png"` unless `out` is given; returns None when `tag` has no data yet.
    """
    run_dir = Path(run_dir)
    path = run_dir / CSV_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {run_dir} has no metrics yet")
    steps, times, values, _ = read_scalars(path, tag)
    if not values.size:
        return None
    from matplotlib.figure import Figure  # a bare Figure renders with Agg, no pyplot state

    fig = Figure(figsize=(11, 4), layout="constrained")
    smooth = moving_average(values, max(1, min(100, values.size // 10)))
    hours = times.max() >= 2 * 3600
    for ax, x, label in zip(
        fig.subplots(1, 2, sharey=True),
        (steps, times / (3600 if hours else 60)),
        ("env steps", "wall time (hours)" if hours else "wall time (minutes)"),
        strict=True,
    ):
        ax.scatter(x, values, s=4, alpha=0.2, color="tab:blue", linewidths=0)
        ax.plot(x, smooth, color="tab:blue", linewidth=1.5)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    fig.axes[0].set_ylabel(tag)
    fig.suptitle(run_dir.resolve().name)
    out = run_dir / CURVE_FILE if out is None else Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out


def read_scalars(path: Path, tag: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows of `tag` in a `metrics.csv`: their steps, times, values and members (a
    population's member column; -1 where a row has none)."""
    steps, times, values, members = [], [], [], []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) in (4, 5) and row[-2] == tag:
                try:
                    step, time, value = int(row[0]), float(row[1]), float(row[-1])
                    member = int(row[2]) if len(row) == 5 and row[2] else -1
                except ValueError:
                    continue  # a row cut short by a crash, or the header
                steps.append(step)
                times.append(time)
                values.append(value)
                members.append(member)
    return np.array(steps), np.array(times), np.array(values), np.array(members, dtype=np.int64)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of each value and the `window - 1` before it (fewer at the start)."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)
