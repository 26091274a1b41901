"""PBT against random search on MinAtar (docs/results.md): the best member's learning curve of each
run, extracted from the run folders into one small CSV, and drawn per game (the mean over seeds,
their spread shaded, PPO's preset rows marked).

    # each run folder of `onebox pbt ppo --env MinAtar/GAME-v1 ... --selection truncation|none`
    python benchmarks/pbt_curves.py extract RUN [RUN ...] --data benchmarks/data/pbt-minatar.csv
    python benchmarks/pbt_curves.py plot --data benchmarks/data/pbt-minatar.csv \\
        --out docs/figures/pbt-minatar.png

A run's best member is the one whose last 100 training episodes have the highest mean (as the
table in docs/results.md ranks them). Its curve is its ancestral curve (its own episodes since
its last copy, before that its parent's, back to step 0: `onebox.pbt.plots.ancestral`); with
random search (`--selection none`: no copies) that is its own episodes. `extract` appends one row
per run and bin of env steps: the mean return of the curve's episodes that ended in the bin.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from onebox.pbt.plots import LINEAGE_FILE, ancestral
from onebox.run import load_config
from onebox.run.logger import CSV_FILE, RETURN_TAG
from onebox.run.plots import read_scalars

BIN = 25_000
"""Env steps per member in one point of a curve."""
LAST = 100
"""Episodes in a member's final score."""
PPO_PRESET = {"Breakout": (19.72, 13.66, 19.45), "SpaceInvaders": (97.86, 119.31, 95.26),
              "Asterix": (7.00, 7.01, 9.59)}  # fmt: skip
"""PPO's `minatar` preset at 1M steps, 3 seeds each (docs/results.md, "PPO on MinAtar")."""
FIELDS = ["game", "seed", "method", "best", "final", "step", "return"]


def best_curve(run: Path) -> tuple[dict[str, object], np.ndarray, np.ndarray]:
    """(the run's game, seed, method, best member and its final score; the steps and returns of
    the best member's curve)."""
    config = load_config(run)
    steps, _, returns, members = read_scalars(run / CSV_FILE, RETURN_TAG)
    n = int(members.max()) + 1
    finals = [returns[members == m][-LAST:].mean() for m in range(n)]
    best = int(np.argmax(finals))
    events = json.loads((run / LINEAGE_FILE).read_text())["events"]  # no copies: its own
    mine = ancestral(events, best, steps, members)
    info = {"game": config.env.removeprefix("MinAtar/").removesuffix("-v1"),
            "seed": config.seed, "method": "random" if config.selection == "none" else "pbt",
            "best": best, "final": round(float(finals[best]), 2)}  # fmt: skip
    return info, steps[mine], returns[mine]


def extract(runs: list[Path], data: Path) -> None:
    new = not data.is_file()
    data.parent.mkdir(parents=True, exist_ok=True)
    with open(data, "a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        if new:
            writer.writeheader()
        for run in runs:
            info, steps, returns = best_curve(run)
            bins = steps // BIN
            for b in np.unique(bins):
                writer.writerow({**info, "step": int((b + 1) * BIN),
                                 "return": round(float(returns[bins == b].mean()), 3)})  # fmt: skip
            print(f"{run}: {info}")


def plot(data: Path, out: Path) -> None:
    from matplotlib.figure import Figure

    with open(data, newline="") as f:
        rows = list(csv.DictReader(f))
    games = [g for g in PPO_PRESET if any(r["game"] == g for r in rows)]
    fig = Figure(figsize=(4.2 * len(games), 3.4), layout="constrained")
    for ax, game in zip(np.atleast_1d(fig.subplots(1, len(games))), games, strict=True):
        for method, color, label in (("pbt", "C0", "PBT: best member"),
                                     ("random", "C1", "random search: best member")):  # fmt: skip
            mine = [r for r in rows if r["game"] == game and r["method"] == method]
            seeds = sorted({r["seed"] for r in mine})
            steps = sorted({int(r["step"]) for r in mine})
            curves = np.full((len(seeds), len(steps)), np.nan)
            for r in mine:
                curves[seeds.index(r["seed"]), steps.index(int(r["step"]))] = float(r["return"])
            if not seeds:
                continue
            ax.plot(steps, np.nanmean(curves, 0), color=color,
                    label=f"{label} ({len(seeds)} seeds)")  # fmt: skip
            ax.fill_between(steps, np.nanmin(curves, 0), np.nanmax(curves, 0), color=color,
                            alpha=0.2, linewidth=0)  # fmt: skip
        preset = PPO_PRESET[game]
        ax.axhspan(min(preset), max(preset), color="grey", alpha=0.25,
                   label="PPO preset at 1M (3 seeds)")  # fmt: skip
        ax.set_title(f"MinAtar {game}")
        ax.set_xlabel("env steps per member")
        ax.grid(alpha=0.3)
    fig.axes[0].set_ylabel("episodic return (mean per 25k steps)")
    fig.axes[0].legend(fontsize=7, loc="upper left")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="append runs' best-member curves to --data")
    ex.add_argument("runs", type=Path, nargs="+")
    ex.add_argument("--data", type=Path, required=True)
    pl = sub.add_parser("plot", help="draw --data's curves into --out")
    pl.add_argument("--data", type=Path, required=True)
    pl.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "extract":
        extract(args.runs, args.data)
    else:
        plot(args.data, args.out)


if __name__ == "__main__":
    main()
