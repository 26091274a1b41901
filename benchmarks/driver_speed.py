"""Training SPS of two onebox installs side by side: a learner's run on the old code and on the
new, in interleaved rounds (the order alternating each round), on the same machine.

Each measurement is one `python -m onebox train LEARNER ...` in the install's interpreter, with
the learner's preset and a fixed length; its SPS is read from the run's own `metrics.csv` from
the first logged update to the last (the warm-up before the first log, and for the replay
learners the random steps before learning starts, left out). Both installs log `charts/SPS` at
the time column of `metrics.csv`.

    python benchmarks/driver_speed.py --old /work/venv-old/bin/python \\
        --new /work/venv/bin/python --rounds 3 --out benchmarks/reports/driver-speed.md
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

CASES: dict[str, dict[str, list[str]]] = {
    "CartPole-v1": {
        "ppo": ["--total-steps", "51200"],
        "appo": ["--total-steps", "12800", "--batch-unrolls", "1", "--num-minibatches", "4"],
        "impala": ["--total-steps", "40000"],
        "dqn": ["--total-steps", "40000", "--learning-starts", "5000"],
        "apex": ["--total-steps", "30000"],
    },
    "Pong-v5": {
        "ppo": ["--total-steps", "7168"],
        "appo": ["--total-steps", "12800"],
        "impala": ["--total-steps", "12800"],
        "dqn": ["--total-steps", "4000", "--learning-starts", "1000"],
        "apex": [
            "--total-steps",
            "32000",
            "--learning-starts",
            "2000",
            "--actors",
            "2",
            "--envs-per-actor",
            "8",
            "--batch-size",
            "32",
            "--samples-per-insert",
            "1",
        ],
    },
}
"""Per env and learner: the run's length (and learning start), each a run of tens of seconds on
a 2-core machine, with the preset's other settings (APPO's on CartPole: its classic preset until
2026-12-02, one unroll and 4 epochs of 4 minibatches a batch, the same on both installs; Ape-X's
on Pong: 2 actors of 8 envs held to one sampled transition per inserted one, so that its
learner, which the old code logged every 100 updates, logs often enough in a short run)."""


def sps(run_dir: Path) -> float:
    """Env steps per second between the run's first and last `charts/SPS` rows."""
    with open(run_dir / "metrics.csv") as f:
        rows = [(int(r["step"]), float(r["time"])) for r in csv.DictReader(f)
                if r["tag"] == "charts/SPS"]  # fmt: skip
    if len(rows) < 2:
        raise RuntimeError(f"{run_dir}: fewer than two logs of SPS; make the run longer")
    (s0, t0), (s1, t1) = rows[0], rows[-1]
    return (s1 - s0) / (t1 - t0)


def measure(python: str, env: str, learner: str, args: list[str], root: Path, name: str) -> float:
    """One run of `learner` on `env` in the install of `python`; its SPS."""
    cmd = [python, "-m", "onebox", "train", learner, "--env", env, *args, "--runs-dir", str(root),
           "--name", name, "--progress", "False", "--checkpoint-minutes", "0"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=root)
    return sps(root / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the old install's python")
    parser.add_argument("--new", required=True, help="the new install's python")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--envs", nargs="*", default=list(CASES))
    parser.add_argument("--learners", nargs="*", default=["ppo", "appo", "impala", "dqn", "apex"])
    parser.add_argument("--out", type=Path, help="markdown file to write the table to")
    a = parser.parse_args()
    results: dict[tuple[str, str, str], list[float]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for k in range(a.rounds):
            sides = [("old", a.old), ("new", a.new)]
            if k % 2:
                sides.reverse()
            for env in a.envs:
                for learner in a.learners:
                    for side, python in sides:
                        rate = measure(python, env, learner, CASES[env][learner], root,
                                       f"{env.replace('/', '_')}-{learner}-{side}-{k}")  # fmt: skip
                        results.setdefault((env, learner, side), []).append(rate)
                        print(f"round {k + 1}: {env} {learner} {side}: {rate:,.0f} SPS", flush=True)
    lines = [
        f"Training SPS, old ({a.old}) and new ({a.new}) onebox, {a.rounds} interleaved rounds "
        f"({(time.perf_counter() - started) / 60:.0f} min), {platform.node()}: "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}.",
        "",
        "| env | learner | run | old SPS (rounds) | new SPS (rounds) | new / old (median) |",
        "|---|---|---|---|---|---|",
    ]
    for env in a.envs:
        for learner in a.learners:
            old, new = results[(env, learner, "old")], results[(env, learner, "new")]
            ratio = statistics.median(new) / statistics.median(old)
            lines.append(
                f"| {env} | {learner} | {' '.join(CASES[env][learner])} | "
                f"{', '.join(f'{x:,.0f}' for x in old)} | {', '.join(f'{x:,.0f}' for x in new)} "
                f"| {ratio:.2f} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out is not None:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
