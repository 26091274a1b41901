"""A population against its members run one by one: total env frames per second of `onebox pbt`
(one process: its members on one shared engine or each on its own env pools, `--engine`,
stepped or updated by `--workers` threads) and of the same number of separate
`onebox train` processes run back to back, each as long as a member, in interleaved rounds (the
order alternating each round), on one machine.

Each measurement is the wall time of whole commands (start-up included), so frames/s is the
population's frames (members x steps) over the time it took to get them either way.

    python benchmarks/pbt_speed.py --python /work/venv/bin/python --rounds 2 \\
        --out benchmarks/reports/pbt-speed.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def timed(python: str, argv: list[str], runs: Path) -> float:
    """Wall seconds of `python -m onebox ARGV --runs-dir RUNS` (which must succeed)."""
    start = time.perf_counter()
    subprocess.run([python, "-m", "onebox", *argv, "--runs-dir", str(runs), "--progress", "False"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python", help="the interpreter onebox is installed in")
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--learner", default="ppo")
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--steps", type=int, default=262144, help="env steps per member")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                        help="the population's --workers settings measured")  # fmt: skip
    parser.add_argument("--engines", nargs="+", default=["own", "shared"],
                        help="the population's --engine settings measured")  # fmt: skip
    parser.add_argument("--updates", nargs="+", default=["separate", "batched"],
                        help="the shared engine's --updates settings measured")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    common = ["--env", args.env, "--total-steps", str(args.steps)]
    cases = {
        f"separate (x{args.population}, back to back)": [
            ["train", args.learner, *common, "--seed", str(1 + i)] for i in range(args.population)
        ]
    }
    for engine in args.engines:
        for updates in args.updates if engine == "shared" else [None]:
            for w in args.workers:
                how = ["--engine", engine, *(["--updates", updates] if updates else []),
                       "--workers", str(w)]  # fmt: skip
                cases[f"onebox pbt {' '.join(how)}"] = [
                    ["pbt", args.learner, *common, "--population", str(args.population), *how,
                     "--ready", str(args.steps // 8)]
                ]  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for name in order:
                seconds = sum(timed(args.python, argv, Path(tmp) / f"{r}") for argv in cases[name])
                times[name].append(seconds)
                print(f"round {r + 1}: {name}: {seconds:.1f} s", flush=True)
    frames = args.population * args.steps
    separate = statistics.median(times[next(iter(cases))])
    lines = [
        f"# {args.learner} population of {args.population} on {args.env}: one process against "
        "separate runs",
        "",
        f"Machine: {platform.node()}, {os.cpu_count()} logical CPUs, {platform.processor()}; "
        f"{args.rounds} interleaved rounds, {args.steps:,} env steps per member "
        f"({frames:,} in all).",
        "",
        "```sh",
        f"python benchmarks/pbt_speed.py --env {args.env} --learner {args.learner} "
        f"--population {args.population} --steps {args.steps} --workers "
        f"{' '.join(map(str, args.workers))} --engines {' '.join(args.engines)} "
        f"--updates {' '.join(args.updates)} --rounds {args.rounds} --out {args.out}",
        "```",
        "",
        "| how | wall seconds (rounds) | frames/s (median) | against separate runs |",
        "|---|---|---|---|",
    ]
    for name, values in times.items():
        median = statistics.median(values)
        lines.append(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} | "
                     f"{frames / median:,.0f} | {separate / median:.2f}x |")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
