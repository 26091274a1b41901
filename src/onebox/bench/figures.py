"""A benchmark's measurement as data and as a figure drawn from that data.

Every `onebox bench ... --output FILE.md` writes, beside the section of its table, the raw
numbers of its run as JSON and the figure drawn from them, `figures/<section>.json` and
`figures/<section>.png` next to FILE.md (`common.write_section`), and the section shows the
figure. The figure is grouped bars (`Bars`): one group per setting measured (a number of
envs, a number of slots, ...), one bar per backend, run or variant, on a log scale where the
values span more than `LOG_SPAN`. Redraw figures from their JSON (after a change to the
drawing, say) with

    python -m onebox.bench.figures docs/figures/*.json
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LOG_SPAN = 30.0
"""Largest over smallest measured value above which the value axis is logarithmic."""
FOLDER = "figures"
"""Where the data and figures go, beside the markdown file."""


@dataclasses.dataclass
class Bars:
    """The numbers of one benchmark run: `values[series][i]` is that series' measurement in
    group `groups[i]` (None where it was not measured: not installed, skipped)."""

    title: str
    """What was measured, where (the figure's title)."""
    unit: str
    """The values' unit (the value axis' label), e.g. "env steps/s"."""
    groups: list[str]
    """The settings measured, in order (e.g. "8 envs", "64 envs")."""
    values: dict[str, list[float | None]]
    """Each series' measurement per group (a backend, a run, a variant)."""

    def __post_init__(self) -> None:
        for name, row in self.values.items():
            if len(row) != len(self.groups):
                raise ValueError(
                    f"series {name!r} has {len(row)} values for {len(self.groups)} groups"
                )

    @property
    def log(self) -> bool:
        """Whether the value axis is logarithmic: the measured values span over `LOG_SPAN`."""
        measured = [v for row in self.values.values() for v in row if v]
        return bool(measured) and max(measured) / min(measured) > LOG_SPAN


def slug(key: str) -> str:
    """A section key (`bench:envs:CartPole-v1`) as a file name (`bench-envs-CartPole-v1`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", key).strip("-")


def save(bars: Bars, markdown: Path, key: str) -> Path:
    """Write `bars` as `figures/<key>.json` beside `markdown` and draw `figures/<key>.png`
    from that file; return the figure's path."""
    return write(bars, Path(markdown).parent / FOLDER / f"{slug(key)}.json")


def write(bars: Bars, data: Path) -> Path:
    """Write `bars` to the JSON file `data` and draw its figure beside it; the figure's path."""
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps(dataclasses.asdict(bars), indent=1) + "\n")
    return draw(data)


def load(data: Path) -> Bars:
    """The `Bars` a JSON file of `save` holds."""
    return Bars(**json.loads(Path(data).read_text()))


def draw(data: Path) -> Path:
    """Draw the figure of the JSON file `data` (written by `save`) beside it, as PNG."""
    from matplotlib.figure import Figure  # a bare Figure renders with Agg, no pyplot state

    bars = load(data)
    width = max(5.0, 1.2 + 0.5 * len(bars.values) * len(bars.groups))
    fig = Figure(figsize=(width, 3.6), layout="constrained")
    ax = fig.subplots()
    plot(ax, bars)
    ax.set_title(bars.title, fontsize=9)
    out = Path(data).with_suffix(".png")
    fig.savefig(out, dpi=100)
    return out


def plot(ax: Any, bars: Bars, series: Sequence[str] | None = None) -> None:
    """Draw `bars` (those of `series` that it has, in that order; default all) on the
    matplotlib axes `ax`: a bar per series in each group, the value axis logarithmic where
    `bars.log` says, a legend."""
    names = [s for s in (series or bars.values) if s in bars.values]
    width = 0.8 / max(1, len(names))
    for k, name in enumerate(names):
        xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(bars.groups))]
        heights = [v if v else 0.0 for v in bars.values[name]]
        ax.bar(xs, heights, width, label=name, color=f"C{k % 10}")
    if bars.log:
        ax.set_yscale("log")
    ax.set_xticks(range(len(bars.groups)), bars.groups)
    ax.set_ylabel(bars.unit + (" (log scale)" if bars.log else ""))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncols=2 if len(names) > 6 else 1)


def main(argv: list[str]) -> int:
    """Redraw the figure of each JSON file named."""
    if not argv:
        print("usage: python -m onebox.bench.figures FILE.json [FILE.json ...]", file=sys.stderr)
        return 2
    for path in argv:
        print(f"wrote {draw(Path(path))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
