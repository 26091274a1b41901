"""The README's headline figure, drawn from two recorded measurements (`onebox.bench.figures` JSON):
env steps per second against EnvPool and Gymnasium (`onebox bench envs --output docs/benchmarks.md`
writes docs/figures/bench-envs-CartPole-v1.json) and time to learn against CleanRL
(`benchmarks/learn_time.py --out docs/figures/learn-time-cartpole` writes its JSON).

    python benchmarks/headline.py docs/figures/bench-envs-CartPole-v1.json \\
        docs/figures/learn-time-cartpole.json --out docs/figures/headline.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from onebox.bench import figures

ENGINES = ("onebox sync", "EnvPool async", "EnvPool sync", "Gymnasium numpy-vectorized",
           "Gymnasium SyncVectorEnv")  # fmt: skip
"""The backends of the engine panel, where measured (the rest stay in docs/benchmarks.md)."""


def draw(engine: Path, learning: Path, out: Path) -> Path:
    """Two panels: the engine's steps/s per backend and env count (log scale where they span
    over 30x), and each program's seconds to the goal and for the whole run."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    figures.plot(left, figures.load(engine), ENGINES)
    figures.plot(right, figures.load(learning))
    left.set_title("CartPole-v1: env steps per second (2-core CPU)", fontsize=9)
    right.set_title("PPO on CartPole-v1: seconds (lower is better)", fontsize=9)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", type=Path, help="the engine benchmark's JSON")
    parser.add_argument("learning", type=Path, help="learn_time.py's JSON")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(f"wrote {draw(args.engine, args.learning, args.out)}")


if __name__ == "__main__":
    main()
