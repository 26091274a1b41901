"""What both modules of the GPU suite (`onebox bench gpu`) share: its config, its parts, the game
it measures and the rows and tables of its report. `onebox.bench.gpu` runs the suite and measures
most parts in its own process; `onebox.bench.gpu_runs` holds the parts that run `onebox train` in
a process of their own."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from onebox.bench import common

Part = Literal["policy", "envs", "train", "inference", "evolve", "offpolicy", "pbt", "learn"]
PARTS: tuple[Part, ...] = ("envs", "train", "evolve", "inference", "offpolicy", "pbt", "policy",
                           "learn")  # fmt: skip
ENV = "Pong-v5"
FRAMES = 4  # frames per Pong-v5 step (frame skip)


@dataclasses.dataclass
class GpuBenchConfig:
    """Run the GPU suite and write one markdown report, `OUT/report.md`."""

    out: Path = Path("gpu-report")
    """Folder of the report (and of the learning run's folder)."""
    parts: tuple[Part, ...] = PARTS
    """Parts to run (all by default), in the suite's order."""
    device: str = "auto"
    """Torch device; `auto` is CUDA, and no GPU is an error unless `--tiny --device cpu`."""
    tiny: bool = False
    """Tiny sizes: seconds of work per part, to check the pipeline; the report says so."""
    env_threads: int = 16
    """Engine threads (each of the evolution's slot groups gets them all)."""
    networks: tuple[Literal["nature-cnn", "mlp"], ...] = ("nature-cnn",)
    """Networks of the policy part."""
    deadline: float | None = None
    """Unix time by which the suite ends (gpu.sh: its start + 9 minutes); the learning run gets
    what is left, at most `learn_minutes`."""
    learn_minutes: float = 8.0
    """Most wall minutes of the learning run."""
    tests: Path | None = None
    """A file with the CUDA tests' summary lines, quoted in the report."""
    warning: Path | None = None
    """A file whose text goes at the top of the report (gpu.sh: how onebox was installed, when
    not from the tree)."""


def keep(rows: list[list[str]], row: list[str]) -> None:
    """Add `row` to a part's `rows` and print it at once: the report is written when a part ends,
    so a suite cut off in the middle of a part (a lease's time running out) still leaves the
    part's measured rows in its output (bench.log)."""
    rows.append(row)
    print("row: | " + " | ".join(row) + " |", flush=True)


def table(header: list[str], rows: list[list[str]]) -> str:
    """A report's markdown table: the first column left-aligned, the others right-aligned."""
    return common.markdown_table(header, rows, [False] + [True] * (len(header) - 1))
