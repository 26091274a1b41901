"""Run the MinAtar paper's own DQN (`examples/dqn.py` of github.com/kenjyoung/MinAtar, imported
unmodified) on one game, logging every episode's return to a CSV as it ends.

The script itself logs only every 1000 episodes and writes its returns at the end; this runs its
`dqn()` on a `minatar.Environment` (full action set, sticky actions 0.1, as the paper) whose `act`
also appends `frame,return,seconds` to the CSV when an episode ends, for FRAMES frames. Seeds:
Python's `random`, numpy's global RNG, torch and the environment.

    python benchmarks/minatar_dqn_peer.py PATH/TO/examples/dqn.py freeway 1000000 1 out.csv
"""

from __future__ import annotations

import importlib.util
import random
import sys
import time

import numpy as np
import torch
from minatar import Environment


class LoggedEnvironment(Environment):
    """A MinAtar environment that appends each finished episode's return to `path`."""

    def __init__(self, game: str, path: str) -> None:
        super().__init__(game)
        self.frames, self.ret, self.start = 0, 0.0, time.time()
        self.out = open(path, "w")  # noqa: SIM115 (open for the whole run)
        self.out.write("frame,return,seconds\n")

    def act(self, a):
        reward, terminal = super().act(a)
        self.frames += 1
        self.ret += reward
        if terminal:
            seconds = time.time() - self.start
            self.out.write(f"{self.frames},{self.ret},{seconds:.1f}\n")
            self.out.flush()
            self.ret = 0.0
        return reward, terminal


def main() -> None:
    script, game, frames, seed, path = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        sys.argv[5],
    )
    spec = importlib.util.spec_from_file_location("minatar_dqn", script)
    assert spec is not None and spec.loader is not None
    dqn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dqn)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    dqn.NUM_FRAMES = frames
    env = LoggedEnvironment(game, path)
    env.seed(seed)
    dqn.dqn(env, False, False, path + ".final")


if __name__ == "__main__":
    main()
