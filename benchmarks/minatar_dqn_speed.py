"""Frames per second of onebox's DQN against the MinAtar paper's own code, one game, same machine.

Both run the paper's DQN (the MinAtar CNN, replay 100k, batch 32, an update every frame after
5,000 frames) on the full action set (`MinAtar/GAME-v0`; the paper's code always plays it) with
one torch thread: onebox's `onebox train dqn` (its `minatar` preset) and MinAtar's
`examples/dqn.py` through `benchmarks/minatar_dqn_peer.py` (imported unmodified). Each run's rate
is taken from its own per-episode log (onebox: metrics.csv; the peer: its CSV): the frames between
the first episode end past `--skip` frames and the last, over the seconds between them, so that
start-up and the update-free first 5,000 frames do not count. Both anneal epsilon over the first
100k frames as the paper does, so in a short run both still skip the greedy forward pass on the
frames they explore. Rounds alternate which runs first; the median of each program's rounds is
printed.

    python benchmarks/minatar_dqn_speed.py PATH/TO/examples/dqn.py --game breakout --rounds 3
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from onebox.bench import common

PEER = Path(__file__).with_name("minatar_dqn_peer.py")
GAMES = {"asterix": "Asterix", "breakout": "Breakout", "freeway": "Freeway",
         "seaquest": "Seaquest", "space_invaders": "SpaceInvaders"}  # fmt: skip


def rate(points: list[tuple[int, float]], skip: int) -> float:
    """Frames per second between the first (frame, seconds) point past `skip` and the last."""
    window = [p for p in points if p[0] > skip]
    if len(window) < 2:
        raise SystemExit(f"fewer than 2 episode ends past frame {skip}: run more --frames")
    (f0, t0), (f1, t1) = window[0], window[-1]
    return (f1 - f0) / (t1 - t0)


def points(path: Path, frame: str, seconds: str, tag: str | None = None) -> list[tuple[int, float]]:
    """(frame, seconds) of each episode end in a CSV log (rows of `tag` only, if given)."""
    with open(path) as f:
        rows = [r for r in csv.DictReader(f) if tag is None or r["tag"] == tag]
    return [(int(r[frame]), float(r[seconds])) for r in rows]


def onebox_run(game: str, frames: int, seed: int, folder: Path) -> list[tuple[int, float]]:
    name = f"onebox-{seed}"
    subprocess.run(
        [sys.executable, "-m", "onebox", "train", "dqn", "--env", f"MinAtar/{GAMES[game]}-v0",
         "--total-steps", str(frames), "--exploration-fraction", str(100_000 / frames),
         "--seed", str(seed), "--torch-threads", "1", "--num-threads", "1", "--name", name,
         "--runs-dir", str(folder), "--progress", "False"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return points(folder / name / "metrics.csv", "step", "time", "charts/episodic_return")


def peer_run(
    script: str, game: str, frames: int, seed: int, folder: Path
) -> list[tuple[int, float]]:
    out = folder / f"peer-{seed}.csv"
    subprocess.run([sys.executable, str(PEER), script, game, str(frames), str(seed), str(out)],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return points(out, "frame", "seconds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("script", help="MinAtar's examples/dqn.py")
    parser.add_argument("--game", default="breakout", choices=sorted(GAMES))
    parser.add_argument("--frames", type=int, default=30_000, help="frames per run")
    parser.add_argument("--skip", type=int, default=10_000, help="frames before the window")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.rounds < 1 or not 5_000 <= args.skip < args.frames:
        parser.error("needs --rounds >= 1 and 5000 <= --skip < --frames (updates start at 5000)")
    rates: dict[str, list[float]] = {"onebox": [], "MinAtar examples/dqn.py": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for r in range(args.rounds):
            runs = [("onebox", lambda s: onebox_run(args.game, args.frames, s, folder)),
                    ("MinAtar examples/dqn.py",
                     lambda s: peer_run(args.script, args.game, args.frames, s, folder))]  # fmt: skip
            for name, run in runs if r % 2 == 0 else runs[::-1]:
                rates[name].append(rate(run(r + 1), args.skip))
                load = os.getloadavg()[0]
                print(f"round {r + 1} {name}: {rates[name][-1]:.1f} frames/s (load {load:.1f})",
                      flush=True)  # fmt: skip
    print("\n| Program | frames/s per round | median |\n| --- | --- | --- |")
    for name, values in rates.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {name} | {each} | {statistics.median(values):.1f} |")
    print(f"\nDate: {common.now()}\n")
    for key, value in common.machine_info(("numpy", "torch", "minatar")).items():
        print(f"- {key}: {value}")


if __name__ == "__main__":
    main()
