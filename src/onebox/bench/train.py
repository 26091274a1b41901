"""`onebox bench train`: PPO's env steps per second, sync and double-buffered, with the time split.

Each sampler mode trains PPO for `--iterations` timed iterations after one warm-up iteration, with
the env family's preset (for Pong-v5, CleanRL's ppo_atari_envpool hyperparameters), in a throwaway
run folder. SPS is measured over the timed iterations only, from the run's own `metrics.csv`; the
time split is the run's `time/*` fractions (env stepping, inference, learning).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Literal

from onebox.bench import common

CLEANRL_ATARI_SPS = 240.0
"""CleanRL's ppo_atari_envpool on Pong-v5 on a 2-core machine like this one, as given in the
project's reference (`shared/reference.md`); its script is not on PyPI, so it is not rerun here."""


@dataclasses.dataclass
class TrainBenchConfig:
    """PPO SPS per sampler mode, with the time split between envs, inference and learning."""

    env: str = "Pong-v5"
    """Env id."""
    samplers: tuple[Literal["sync", "double"], ...] = ("sync", "double")
    """Sampler modes to measure."""
    iterations: int = 3
    """Timed PPO iterations per mode, after one warm-up iteration."""
    num_envs: int | None = None
    """Envs (default: the preset's; 8 for Atari)."""
    num_threads: int | None = None
    """Env pool threads (default: physical cores)."""
    torch_threads: int | None = None
    """Torch CPU threads (default: the learner's choice)."""
    device: str = "auto"
    """Torch device."""
    output: Path | None = None
    """Markdown file to write this env's section into (e.g. docs/benchmarks.md)."""


@dataclasses.dataclass
class Result:
    sampler: str
    sps: float
    split: dict[str, float]
    batch: int


def measure(config: TrainBenchConfig, sampler: str, root: Path) -> Result:
    """Train for 1 + `iterations` iterations and read the timed part back from the run."""
    from onebox.algos import ppo

    base = ppo.Config(env=config.env, num_envs=config.num_envs, sampler=sampler)  # type: ignore[arg-type]
    base = ppo.resolve(dataclasses.replace(base, total_steps=1))
    batch = base.batch_size
    run_config = dataclasses.replace(
        base,
        total_steps=batch * (config.iterations + 1),
        num_threads=config.num_threads or base.num_threads,
        torch_threads=config.torch_threads or base.torch_threads,
        device=config.device,
        runs_dir=str(root),
        name=f"bench-{sampler}",
        checkpoint_minutes=0.0,
        progress=False,
    )
    run_dir = ppo.train(run_config)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    sps_rows = [(int(r["step"]), float(r["time"])) for r in rows if r["tag"] == "charts/SPS"]
    (s0, t0), (s1, t1) = sps_rows[0], sps_rows[-1]
    last = sps_rows[-1][0]
    split = {
        r["tag"].removeprefix("time/"): float(r["value"])
        for r in rows
        if r["tag"].startswith("time/") and int(r["step"]) == last
    }
    return Result(sampler, (s1 - s0) / (t1 - t0), split, batch)


def run(config: TrainBenchConfig) -> int:
    """Measure each sampler mode, print the table, write the markdown section if asked."""
    if config.iterations <= 0:
        raise ValueError(f"--iterations must be positive, got {config.iterations}")
    console = common.console()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as root:
        results = [measure(config, s, Path(root)) for s in config.samplers]
    header = ["sampler", "env steps/s", "frames/s", "env", "inference", "learn", "× CleanRL (240)"]
    frames = 4 if "-v5" in config.env and "/" not in config.env else 1
    rows = [
        [
            r.sampler,
            f"{r.sps:.0f}",
            f"{r.sps * frames:.0f}",
            *(f"{100 * r.split.get(k, 0.0):.0f}%" for k in ("env", "inference", "learn")),
            f"{r.sps / CLEANRL_ATARI_SPS:.2f}×",
        ]
        for r in results
    ]
    from rich.table import Table

    table = Table(title=f"PPO on {config.env}, batch {results[0].batch} steps per iteration")
    for h in header:
        table.add_column(h, justify="left" if h == "sampler" else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if config.output is not None:
        machine = common.machine_info(("numpy", "torch", "gymnasium", "ale-py"))
        lines = [
            f"### PPO training throughput, {config.env}",
            "",
            f"{config.iterations} timed iterations of {results[0].batch} env steps per mode after "
            "one warm-up iteration; the preset's hyperparameters (CleanRL's for this family). "
            "Time split: the share of the run's time in env stepping, inference and learning. "
            f"× CleanRL: against {CLEANRL_ATARI_SPS:.0f} SPS, the reference's figure for CleanRL's "
            "ppo_atari_envpool on a 2-core machine like this one (not rerun here). Frames/s "
            "count 4 frames per Atari step.",
            "",
            f"1-minute load average when the run began: {load:.1f}.",
            "",
            common.markdown_table(header, rows, [False] + [True] * 6),
            "",
            f"Command: `{common.command_line('onebox bench train', config)}`",
            "",
            f"Date: {common.now()}",
            "",
            "Machine:",
            "",
            *[f"- {k}: {v}" for k, v in machine.items()],
        ]
        path = common.write_section(config.output, f"bench:train:{config.env}", "\n".join(lines))
        console.print(f"wrote the {config.env} section of {path}")
    return 0
