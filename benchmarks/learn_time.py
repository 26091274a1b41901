"""Time to learn, onebox against CleanRL: the same algorithm with the same hyperparameters, envs and
steps, each a whole command on one machine, in interleaved rounds (the order alternating).

For each pair, the wall time of the whole command (start-up included) and the time from the
command's start to the first point where the mean of the last 20 training episodes reaches the
goal, both read the same way from each run's TensorBoard events (`charts/episodic_return`, the
tag both write, with each event's wall time). The numbers go to a JSON file and a figure drawn
from it (`onebox.bench.figures`), and a markdown table is printed.

    python benchmarks/learn_time.py --cleanrl ../shared/peers/cleanrl --rounds 2 \\
        --out docs/figures/learn-time-cartpole
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from onebox.bench import common, figures

PAIRS = {
    "PPO, CartPole-v1": (
        ["train", "ppo", "--env", "CartPole-v1", "--device", "cpu", "--total-steps"],
        ["ppo.py", "--env-id", "CartPole-v1", "--no-cuda", "--total-timesteps"],
        475.0,
    ),
}
"""Name: (onebox's arguments, CleanRL's script and arguments, each ending with the flag of the
steps to run; the goal). onebox's `classic` PPO preset is CleanRL ppo.py's defaults (4 envs x
128 steps, 4 epochs of 4 minibatches, Adam 2.5e-4 annealed, clip 0.2, entropy 0.01), on the
CPU both."""
WINDOW = 20
"""Episodes in the moving mean that must reach the goal."""


def returns(run: Path) -> tuple[np.ndarray, np.ndarray]:
    """(wall times, returns) of the `charts/episodic_return` events under `run`, in order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    times, values = [], []
    for events in sorted(run.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        if "charts/episodic_return" in acc.Tags()["scalars"]:
            for e in acc.Scalars("charts/episodic_return"):
                times.append(e.wall_time)
                values.append(e.value)
    order = np.argsort(times, kind="stable")
    return np.asarray(times)[order], np.asarray(values)[order]


def timed(argv: list[str], cwd: Path, goal: float) -> tuple[float, float | None]:
    """(wall seconds of the command, seconds from its start to the goal or None)."""
    start = time.time()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)  # fmt: skip
    wall = time.time() - start
    times, values = returns(cwd)
    if values.size < WINDOW:
        return wall, None
    means = np.convolve(values, np.ones(WINDOW) / WINDOW, "valid")
    reached = np.flatnonzero(means >= goal)
    return wall, (float(times[reached[0] + WINDOW - 1] - start) if reached.size else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cleanrl", type=Path, required=True, help="CleanRL's scripts' folder")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of both")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=500_000, help="env steps of every run")
    parser.add_argument("--out", type=Path, required=True, help="data and figure, without suffix")
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    seconds: dict[str, dict[str, list[tuple[float, float | None]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (ours, theirs, goal) in PAIRS.items():
            runs = seconds[name] = {"onebox": [], "CleanRL": []}
            for r in range(args.rounds):
                for who in ("onebox", "CleanRL") if r % 2 == 0 else ("CleanRL", "onebox"):
                    cwd = Path(tmp) / f"{name}-{who}-{r}".replace(" ", "").replace(",", "-")
                    cwd.mkdir()
                    argv = (
                        [args.python, "-m", "onebox", *ours, str(args.steps), "--seed", str(args.seed),
                         "--runs-dir", str(cwd), "--progress", "False"]
                        if who == "onebox"
                        else [args.python, str(args.cleanrl.resolve() / theirs[0]), *theirs[1:],
                              str(args.steps), "--seed", str(args.seed)]
                    )  # fmt: skip
                    runs[who].append(timed(argv, cwd, goal))
                    wall, reached = runs[who][-1]
                    print(f"round {r + 1} {name} {who}: {wall:.0f} s, goal at "
                          f"{'-' if reached is None else f'{reached:.0f} s'}", flush=True)  # fmt: skip
                    load.append(os.getloadavg()[0])

    def median(values: list[float | None]) -> float | None:
        got = [v for v in values if v is not None]
        return statistics.median(got) if len(got) == len(values) else None

    rows, bars = [], {}
    for name, runs in seconds.items():
        for who, results in runs.items():
            wall, reached = median([w for w, _ in results]), median([g for _, g in results])
            bars[f"{who}: {name}"] = (wall, reached)
            rows.append([name, who, ", ".join(f"{w:.0f}" for w, _ in results),
                         "-" if reached is None else f"{reached:.0f}",
                         ", ".join("-" if g is None else f"{g:.0f}" for _, g in results)])  # fmt: skip
    header = [
        "run",
        "program",
        "wall s (rounds)",
        "to the goal, s (median)",
        "to the goal (rounds)",
    ]
    figure = figures.Bars(
        f"time to learn, onebox and CleanRL ({args.rounds} interleaved rounds, medians)",
        "seconds", ["whole run", f"to the goal (mean of {WINDOW} episodes)"],
        {name: [wall, reached] for name, (wall, reached) in bars.items()},
    )  # fmt: skip
    print(f"wrote {figures.write(figure, args.out.with_suffix('.json'))}")
    print(common.markdown_table(header, rows, [False, False, True, True, True]))
    print(f"1-minute load average: {', '.join(f'{x:.1f}' for x in load)} (start, after each run)")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in common.machine_info(("torch",)).items()))


if __name__ == "__main__":
    main()
