"""A population run's plots, drawn from its `lineage.json` and `metrics.csv`:

- `hyperparams.png`: each mutated hyperparameter of each member over env steps (the schedule
  the population found: a member's value changes where it copied another and explored);
- `curve.png`: every member's episodic returns (faint) and the best member's ancestral curve:
  its own returns since its last copy, before that its parent's, and so on back to step 0;
- `lineage.png`: the family tree: one line per member, a link from parent to child at each
  copy, the best member's ancestry drawn bold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from onebox.run.logger import CSV_FILE, RETURN_TAG
from onebox.run.plots import moving_average, read_scalars

LINEAGE_FILE = "lineage.json"


def ancestry(events: list[dict[str, Any]], member: int, end: int) -> list[tuple[int, int, int]]:
    """The segments (member, from step, to step] whose returns make `member`'s ancestral curve
    up to step `end`: its own since its last copy, before that its parent's up to the copy (the
    parent's state as it was then: copies earlier in the lineage), and so on."""
    segments: list[tuple[int, int, int]] = []
    index = len(events)
    while True:
        copies = [k for k in range(index) if events[k]["member"] == member
                  and events[k].get("parent") is not None]  # fmt: skip
        if not copies:
            segments.append((member, 0, end))
            return segments[::-1]
        k = copies[-1]
        start = events[k]["step"]
        segments.append((member, start, end))
        member, end, index = events[k]["parent"], start, k


def ancestral(
    events: list[dict[str, Any]], member: int, steps: np.ndarray, members: np.ndarray
) -> np.ndarray:
    """Which of a population's rows (their `steps` and `members`, in time order) make
    `member`'s ancestral curve up to the last step (`ancestry`'s segments)."""
    line = np.zeros(steps.size, bool)
    for m, lo, hi in ancestry(events, member, int(steps.max()) if steps.size else 0):
        line |= (members == m) & (steps > lo) & (steps <= hi)
    return line


def plot_population(run_dir: Path, best: int) -> list[Path]:
    """Draw the three plots of the run in `run_dir` (`best`: the member ranked first); return
    their paths (none before any episode or lineage exists)."""
    from matplotlib.figure import Figure  # a bare Figure renders with Agg, no pyplot state

    run_dir = Path(run_dir)
    lineage_path, csv_path = run_dir / LINEAGE_FILE, run_dir / CSV_FILE
    if not lineage_path.is_file() or not csv_path.is_file():
        return []
    lineage = json.loads(lineage_path.read_text())
    events, space, n = lineage["events"], lineage["space"], lineage["members"]
    steps, _, returns, members = read_scalars(csv_path, RETURN_TAG)
    end = int(steps.max()) if steps.size else max((e["step"] for e in events), default=0)
    colors = [f"C{i % 10}" for i in range(n)]
    out = []

    cols = min(4, max(1, len(space)))
    rows = -(-max(1, len(space)) // cols)
    fig = Figure(figsize=(3.6 * cols, 2.8 * rows), layout="constrained")
    path = ancestry(events, best, end)
    for ax, (name, (_low, _high, scale)) in zip(
        np.atleast_1d(fig.subplots(rows, cols)).flat, space.items(), strict=False
    ):
        for m in range(n):
            mine = [e for e in events if e["member"] == m]
            xs = [e["step"] for e in mine] + [end]
            ys = [e["hyperparams"][name] for e in mine]
            ax.step(xs, [*ys, ys[-1]], where="post", color=colors[m], alpha=0.45, linewidth=1,
                    label=f"member {m}")  # fmt: skip
        xs, ys = [], []
        for m, lo, hi in path:  # the best member's schedule: its ancestors' values in turn
            mine = [e for e in events if e["member"] == m and e["step"] < hi]
            first = [e for e in mine if e["step"] <= lo][-1:]
            for e in first + [e for e in mine if e["step"] > lo]:
                xs.append(max(e["step"], lo))
                ys.append(e["hyperparams"][name])
        ax.step([*xs, end], [*ys, ys[-1]], where="post", color="black", linewidth=2,
                label=f"member {best}'s ancestry")  # fmt: skip
        if scale == "log":
            ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    for ax in fig.axes[len(space) :]:
        ax.set_visible(False)
    fig.axes[0].legend(fontsize=6)
    out.append(_save(fig, run_dir / "hyperparams.png"))

    if steps.size:
        fig = Figure(figsize=(8, 4), layout="constrained")
        ax = fig.subplots()
        for m in range(n):
            mine = members == m
            if mine.any():
                smooth = moving_average(returns[mine], max(1, min(50, mine.sum() // 10)))
                ax.plot(steps[mine], smooth, color=colors[m], alpha=0.3, linewidth=1)
        line = ancestral(events, best, steps, members)
        x, y = steps[line], returns[line]
        if y.size:
            ax.plot(x, moving_average(y, max(1, min(50, y.size // 10))), color="black",
                    linewidth=2, label=f"best member ({best}) and its ancestors")  # fmt: skip
            ax.legend()
        ax.set_xlabel("env steps per member")
        ax.set_ylabel(RETURN_TAG)
        ax.grid(alpha=0.3)
        fig.suptitle(run_dir.resolve().name)
        out.append(_save(fig, run_dir / "curve.png"))

    fig = Figure(figsize=(8, 0.4 * n + 1.5), layout="constrained")
    ax = fig.subplots()
    for m in range(n):
        ax.hlines(m, 0, end, color=colors[m], alpha=0.4)
    for e in events:
        if e.get("parent") is not None:
            ax.annotate("", xy=(e["step"], e["member"]), xytext=(e["step"], e["parent"]),
                        arrowprops={"arrowstyle": "->", "color": "grey", "alpha": 0.6})  # fmt: skip
    path = ancestry(events, best, end)
    for (m, lo, hi), nxt in zip(path, [*path[1:], None], strict=True):
        ax.hlines(m, lo, hi, color="black", linewidth=2.5)
        if nxt is not None:
            ax.vlines(hi, min(m, nxt[0]), max(m, nxt[0]), color="black", linewidth=2.5)
    ax.set_yticks(range(n))
    ax.set_ylabel("member")
    ax.set_xlabel("env steps per member")
    ax.set_title(f"lineage: copies (parent -> child); bold: member {best}'s ancestry")
    out.append(_save(fig, run_dir / "lineage.png"))
    return out


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path
