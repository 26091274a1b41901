"""The GPU suite's parts that run `onebox train` in a process of its own, stopped at a deadline
(`onebox.bench.gpu` runs them): Ape-X and R2D2 on Pong with their learners on the device
("offpolicy"), a population of PPO members on MinAtar against one member ("pbt"), and PPO's
learning run on Pong to a score of 20 ("learn")."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from onebox.bench import common
from onebox.bench.gpu_common import ENV, FRAMES, GpuBenchConfig, keep, table

# ---- offpolicy: Ape-X and R2D2 on Pong ------------------------------------------------------------


def train_for(args: list[str], seconds: float, log: Path) -> float:
    """Run `onebox ARGS` for at most `seconds`, then Ctrl-C it (a run saves a checkpoint and
    exits); its wall time."""
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "onebox", *args], stdout=f,
                                stderr=subprocess.STDOUT)  # fmt: skip
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return time.time() - t0


def part_offpolicy(config: GpuBenchConfig, device: torch.device, size: dict, out: Path) -> str:
    from onebox.bench.apex import learning_rates

    threads = max(1, config.env_threads // 8)
    rows, commands = [], []
    for algo, starts in size["offpolicy_starts"].items():
        args = ["train", algo, "--env", ENV, "--device", str(device), "--process-actors",
                "--num-threads", str(threads), "--learning-starts", str(starts),
                *size["offpolicy_args"], "--total-steps", "50000000",
                "--runs-dir", str(out / "runs"), "--name", algo, "--checkpoint-minutes", "0",
                "--progress", "False"]  # fmt: skip
        commands.append(f"`onebox {' '.join(args)}`")
        wall = train_for(args, size["offpolicy_seconds"], out / f"{algo}.log")
        rates = learning_rates(out / "runs" / algo / "metrics.csv")
        if rates is None:
            keep(rows, [algo, f"{wall:.0f} s", "-", "-", "-", f"too few updates: see {algo}.log"])
            continue
        updates, steps = rates
        keep(rows, [algo, f"{wall:.0f} s", common.format_rate(steps),
                     common.format_rate(FRAMES * steps), f"{updates:.1f}", ""])  # fmt: skip
    header = ["learner", "wall", "env steps/s", "frames/s", "updates/s", "note"]
    return "\n".join([
        f"## Ape-X and R2D2 on {ENV}, learner on {device}", "",
        f"Each run's Atari preset with process actors of {threads} env thread(s), stopped after "
        f"{size['offpolicy_seconds']:g} s; rates between the first and last update counts the run "
        "logged (its learning phase):", "",
        *[f"- {c}" for c in commands], "",
        table(header, rows),
    ])  # fmt: skip


# ---- pbt: a PPO population on MinAtar ----------------------------------------------------------

PBT_ENV = "MinAtar/Breakout-v1"


def last_sps(metrics: Path) -> float | None:
    """The last `charts/SPS` a run logged (a population's: all its members', the row with no
    member), or None."""
    sps = None
    if metrics.is_file():
        with open(metrics) as f:
            for r in csv.DictReader(f):
                if r["tag"] == "charts/SPS" and not r.get("member"):
                    sps = float(r["value"])
    return sps


def part_pbt(config: GpuBenchConfig, device: torch.device, size: dict, out: Path) -> str:
    """One PPO member on MinAtar Breakout (its preset), then a population of them on one
    engine with the members' updates batched and separate: env steps/s, and the population's
    wall time against one member's at the same steps per member (goal: 16 members within
    1.5x)."""
    n, steps = size["pbt_population"], size["pbt_steps"]
    common_args = ["ppo", "--env", PBT_ENV, "--total-steps", str(steps), "--device", str(device),
                   "--num-threads", str(config.env_threads), *size["pbt_args"],
                   "--runs-dir", str(out / "runs"), "--checkpoint-minutes", "0",
                   "--progress", "False"]  # fmt: skip
    population = ["--population", str(n), "--engine", "shared", "--ready", str(steps // 4)]
    cases = {
        "one member (`onebox train`)": ["train", *common_args, "--name", "pbt-one"],
        f"{n} members, --updates batched": ["pbt", *common_args, *population,
                                            "--updates", "batched", "--name", "pbt-batched"],
        f"{n} members, --updates separate": ["pbt", *common_args, *population,
                                             "--updates", "separate", "--name", "pbt-separate"],
    }  # fmt: skip
    rows, one = [], None
    for label, args in cases.items():
        name = args[args.index("--name") + 1]
        wall = train_for(args, size["pbt_seconds"], out / f"{name}.log")
        sps = last_sps(out / "runs" / name / "metrics.csv")
        if sps is None:
            keep(rows, [label, f"{wall:.0f} s", "-", "-", f"no SPS logged: see {name}.log"])
            continue
        members = 1 if one is None else n
        one = sps if one is None else one
        keep(rows, [label, f"{wall:.0f} s", common.format_rate(sps),
                    f"{members * one / sps:.2f}x", ""])  # fmt: skip
    header = ["run", "wall", "env steps/s (all members)", "time per member step vs one", "note"]
    return "\n".join([
        f"## A population of {n} PPO members on {PBT_ENV}, on {device}", "",
        f"{steps:,} env steps per member (or {size['pbt_seconds']:g} s), PPO's MinAtar preset, "
        "the members on one engine (`--engine shared`). The last column is the population's "
        f"wall time over one member's at the same steps per member (goal: {n} members within "
        "1.5x):", "",
        *[f"- `onebox {' '.join(args)}`" for args in cases.values()], "",
        table(header, rows),
    ])  # fmt: skip


# ---- learn: PPO on Pong to 20 -------------------------------------------------------------------


def part_learn(config: GpuBenchConfig, device: torch.device, size: dict, out: Path) -> str:
    minutes = config.learn_minutes
    if config.deadline is not None:
        minutes = min(minutes, (config.deadline - time.time() - 30) / 60)
    if minutes < 0.5:
        return "## Learning run\n\nSkipped: less than half a minute was left before the deadline."
    runs = out / "runs"
    n = size["learn_envs"]
    args = ["train", "ppo", "--env", ENV, "--num-envs", str(n),
            "--num-steps", "128", "--num-minibatches", "4", "--update-epochs", "4",
            "--sampler", "double", "--total-steps", "10000000", "--device", str(device),
            "--num-threads", str(config.env_threads), "--runs-dir", str(runs), "--name", "learn",
            "--checkpoint-minutes", "0", "--progress", "False"]  # fmt: skip
    wall = train_for(args, 60 * minutes, out / "learn.log")
    returns, sps = [], 0.0
    metrics = runs / "learn" / "metrics.csv"
    if metrics.is_file():
        with open(metrics) as f:
            for r in csv.DictReader(f):
                if r["tag"] == "charts/episodic_return":
                    returns.append((int(r["step"]), float(r["time"]), float(r["value"])))
                elif r["tag"] == "charts/SPS":
                    sps = float(r["value"])
    lines = [f"## Learning run: PPO on {ENV}", "",
             f"`onebox {' '.join(args)}`, stopped after {wall / 60:.1f} min (the budget: "
             f"{minutes:.1f} min). Score: the mean of the last 20 whole games.", ""]  # fmt: skip
    if len(returns) < 20:
        return "\n".join([*lines, f"Fewer than 20 games finished ({len(returns)}); see learn.log."])
    values = np.array([v for _, _, v in returns])
    means = np.convolve(values, np.ones(20) / 20, "valid")
    best = int(np.argmax(means))
    reached = np.flatnonzero(means >= 20)
    steps, seconds = returns[-1][0], returns[-1][1]
    lines.append(f"Last score {means[-1]:.1f} at {steps:,} steps and {seconds / 60:.1f} min; "
                 f"best {means[best]:.1f} at {returns[best + 19][1] / 60:.1f} min; "
                 f"last SPS {sps:.0f}.")  # fmt: skip
    if reached.size:
        at = returns[reached[0] + 19]
        lines.append(f"Goal: a score of 20 at {at[1] / 60:.1f} min ({at[0]:,} steps): "
                     + ("met (<= 8 min)." if at[1] <= 480 else "missed (> 8 min)."))  # fmt: skip
    else:
        projected = 10_000_000 / sps / 60 if sps else float("nan")
        lines.append(f"Goal: 20 not reached. Projected: {projected:.0f} min for the 10M steps "
                     "in which CleanRL's PPO reaches 20.45 on Pong (shared/reference.md), at "
                     "the last SPS.")  # fmt: skip
    return "\n".join(lines)


PART_FNS = {"offpolicy": part_offpolicy, "pbt": part_pbt, "learn": part_learn}
"""The parts of this module, by name."""
