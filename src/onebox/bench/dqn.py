"""`onebox bench dqn`: DQN's env steps per second against CleanRL's dqn_atari.py, side by side.

Both train on Breakout with CleanRL's Atari hyperparameters (one env, an update of batch 32 every
4 steps, Adam 1e-4, target copy every 1000 steps), for `--total-steps` steps with the same
`--learning-starts` and `--buffer-size` (CleanRL's 1M buffer of stacked frames needs 26 GB up
front; its rate does not depend on the size). SPS is that of the learning phase only: from the
runs' own logs of cumulative SPS (onebox: metrics.csv; CleanRL: its `SPS:` prints), the steps
between the first log after learning starts and the last, over the time between them. Each round
runs both, one after the other, alternating which goes first, both with `--torch-threads`; the
table gives the median over the rounds, so that a drift in the machine's load hits both alike.

CleanRL's script is run as it is, from `--cleanrl` (a checkout of its scripts, e.g. the
project's shared/peers/cleanrl), under Gymnasium 1.x: before it runs, ALE's envs are registered
and the two wrappers it names by their pre-1.0 names (GrayScaleObservation, FrameStack) are given
those names. onebox's run is `onebox train dqn`, whose time split (`time/*`) is shown too.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from onebox.bench import common, figures

SHIM = """
import os, runpy, sys
import ale_py, gymnasium as gym, torch
gym.register_envs(ale_py)
gym.wrappers.GrayScaleObservation = gym.wrappers.GrayscaleObservation
gym.wrappers.FrameStack = gym.wrappers.FrameStackObservation
torch.set_num_threads(int(sys.argv[1]))
script = sys.argv[2]
sys.path.insert(0, os.path.dirname(script))
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""
"""Runs CleanRL's script unchanged under Gymnasium 1.x (see the module docstring)."""


@dataclasses.dataclass
class DqnBenchConfig:
    """DQN's learning-phase env steps/s against CleanRL's dqn_atari.py, interleaved rounds."""

    env: str = "Breakout-v5"
    """onebox's env id."""
    cleanrl_env: str = "BreakoutNoFrameskip-v4"
    """The same game's id for CleanRL's script (its own Atari wrappers)."""
    cleanrl: Path = Path("../shared/peers/cleanrl/dqn_atari.py")
    """CleanRL's dqn_atari.py."""
    total_steps: int = 6000
    """Env steps per run."""
    learning_starts: int = 2000
    """Env steps before the first update, both runs."""
    buffer_size: int = 100_000
    """Replay capacity, both runs."""
    torch_threads: int = 1
    """Torch CPU threads, both runs."""
    rounds: int = 3
    """Interleaved rounds (each runs both)."""
    output: Path | None = None
    """Markdown file to write the section into (e.g. docs/benchmarks.md)."""


def learning_sps(points: list[tuple[int, float]], learning_starts: int) -> float:
    """Steps/s between the first and last (step, cumulative SPS) log after `learning_starts`:
    a cumulative SPS s at step n was logged n / s seconds after the start."""
    after = [(n, n / s) for n, s in points if n > learning_starts and s > 0]
    if len(after) < 2:
        raise RuntimeError(f"fewer than 2 SPS logs after learning starts: {points}")
    (n0, t0), (n1, t1) = after[0], after[-1]
    return (n1 - n0) / (t1 - t0)


def call(command: list[str], cwd: Path) -> str:
    """Run `command`; its stdout, or a RuntimeError with the end of its output if it failed."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def run_onebox(config: DqnBenchConfig, root: Path, k: int) -> tuple[float, dict[str, float]]:
    """onebox's learning-phase SPS and its time split."""
    args = ["train", "dqn", "--env", config.env, "--total-steps", str(config.total_steps),
            "--learning-starts", str(config.learning_starts), "--buffer-size",
            str(config.buffer_size), "--torch-threads", str(config.torch_threads),
            "--num-threads", "1", "--checkpoint-minutes", "0", "--progress", "False",
            "--runs-dir", str(root), "--name", f"onebox-{k}"]  # fmt: skip
    call([sys.executable, "-m", "onebox", *args], root)
    with open(root / f"onebox-{k}" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    # The loop logs SPS since its start: (step, SPS) as CleanRL prints them.
    points = [(int(r["step"]), float(r["value"])) for r in rows if r["tag"] == "charts/SPS"]
    last = points[-1][0]
    split = {
        r["tag"].removeprefix("time/"): float(r["value"])
        for r in rows
        if r["tag"].startswith("time/") and int(r["step"]) == last
    }
    return learning_sps(points, config.learning_starts), split


def run_cleanrl(config: DqnBenchConfig, root: Path) -> float:
    """CleanRL's learning-phase SPS, from its `SPS:` prints (every 100 steps once learning)."""
    args = ["--env-id", config.cleanrl_env, "--total-timesteps", str(config.total_steps),
            "--learning-starts", str(config.learning_starts), "--buffer-size",
            str(config.buffer_size), "--seed", "1"]  # fmt: skip
    script = str(config.cleanrl.resolve())
    out = subprocess.run(
        [sys.executable, "-c", SHIM, str(config.torch_threads), script, *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # It prints at steps > learning_starts that are multiples of 100 (the train frequency's).
    sps = [int(m) for m in re.findall(r"^SPS: (\d+)$", out, re.M)]
    first = (config.learning_starts // 100 + 1) * 100
    return learning_sps([(first + 100 * i, s) for i, s in enumerate(sps)], config.learning_starts)


def run(config: DqnBenchConfig) -> int:
    """Run the rounds, print the table, write the markdown section if asked."""
    if not 0 < config.learning_starts <= config.total_steps - 2000:
        raise ValueError(
            "--total-steps must exceed --learning-starts by at least 2000 (onebox logs its SPS "
            "every 1000 steps; the learning phase needs two logs)"
        )
    if config.rounds <= 0 or config.torch_threads <= 0:
        raise ValueError("--rounds and --torch-threads must be positive")
    if not config.cleanrl.exists():
        raise ValueError(f"--cleanrl {config.cleanrl} does not exist: point it at dqn_atari.py")
    console = common.console()
    loads = [os.getloadavg()[0]]
    ours: list[float] = []
    theirs: list[float] = []
    splits: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(config.rounds):
            for who in ("onebox", "cleanrl") if k % 2 == 0 else ("cleanrl", "onebox"):
                if who == "onebox":
                    sps, split = run_onebox(config, Path(tmp), k)
                    ours.append(sps)
                    splits.append(split)
                else:
                    theirs.append(run_cleanrl(config, Path(tmp)))
                console.print(
                    f"round {k + 1} {who}: {(ours if who == 'onebox' else theirs)[-1]:.0f} SPS"
                )
            loads.append(os.getloadavg()[0])
    ratio = statistics.median(ours) / statistics.median(theirs)
    split = {k: statistics.median(s[k] for s in splits) for k in splits[0]}
    header = ["run", "SPS (median)", "range", *(f"time/{k}" for k in split), "× CleanRL"]
    rows = [
        ["onebox dqn", f"{statistics.median(ours):.0f}", f"{min(ours):.0f}-{max(ours):.0f}",
         *(f"{100 * v:.0f}%" for v in split.values()), common.format_ratio(ratio)],
        ["CleanRL dqn_atari.py", f"{statistics.median(theirs):.0f}",
         f"{min(theirs):.0f}-{max(theirs):.0f}", *("-" for _ in split), "1.00×"],
    ]  # fmt: skip
    common.print_table(console, f"DQN learning-phase SPS on {config.env}", header, rows)
    if config.output is not None:
        lines = [
            "### DQN against CleanRL's dqn_atari.py",
            "",
            f"{config.rounds} interleaved rounds of {config.total_steps} steps, learning from step "
            f"{config.learning_starts}; replay {config.buffer_size}; {config.torch_threads} torch "
            "thread(s) each. SPS: the learning phase's (see `onebox/bench/dqn.py`); the time "
            "split is onebox's, over the whole run (median over the rounds).",
            "",
            "1-minute load average: "
            + ", ".join(f"{x:.1f}" for x in loads)
            + " (at the start and after each round; the 2 cores are shared with other work).",
            "",
            common.markdown_table(header, rows, [False] + [True] * (len(header) - 1)),
            "",
            "Each round's SPS, onebox / CleanRL (onebox ran first in odd rounds): "
            + ", ".join(f"{a:.0f} / {b:.0f}" for a, b in zip(ours, theirs, strict=True))
            + ".",
            "",
            *common.provenance(
                "onebox bench dqn", config, ("numpy", "torch", "gymnasium", "ale-py")
            ),
        ]
        bars = figures.Bars(f"DQN learning-phase SPS on {config.env}, {config.rounds} rounds",
                            "env steps/s", [f"round {k + 1}" for k in range(config.rounds)],
                            {"onebox dqn": list(ours), "CleanRL dqn_atari.py": list(theirs)})  # fmt: skip
        path = common.write_section(config.output, f"bench:dqn:{config.env}", "\n".join(lines),
                                    bars)  # fmt: skip
        console.print(f"wrote the {config.env} section of {path}")
    return 0
