"""What seeded resets cost evolution on Atari: the evaluator's ceiling with networks that cost nothing.

A seeded reset of an ALE env reloads its ROM, and evolution makes one per episode
(`--episode-seeds pair`) or one per env per evaluation (`--episode-seeds env`). Env-only frames/s
(`onebox bench evolve`'s ceiling) make none. This measures, on ALE's Pong pools:

- a seeded reset of every env of a pool against a step of the same pool with random actions:
  how many steps' time one costs (S), and so the most a population can make of env-only when
  each env plays E episodes of L steps per seeded reset: E*L / (E*L + S);
- the evaluator's own loop (`PopulationEvaluator`, two slot groups, env seeds) with its networks
  replaced by constant actions, so that nothing but the loop, the resets and the engine costs
  time, against env-only frames/s of the same pools, for E = population / slots.

Rounds interleave the E values.

    python benchmarks/seeded_resets.py --envs 32 --threads 2 --episodes 2 4 8 --rounds 2
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import onebox.envs
from onebox.bench.evolve import env_only_rate
from onebox.evo.evaluator import PopulationEvaluator


class ConstantActions:
    """Stands in for the evaluator's population network: action 0 (no-op) for every slot, at no
    cost; parameters are one ignored number per individual."""

    num_params = 1

    def __init__(self, net: object) -> None:
        self.obs_shape, self.device, self.arch = net.obs_shape, net.device, net.arch

    def act(self, obs: torch.Tensor, slots: slice) -> np.ndarray:
        return np.zeros(slots.stop - slots.start, dtype=np.int64)

    def set_slots(self, slots: torch.Tensor, flat: torch.Tensor) -> None:
        pass

    def move_slots(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        pass

    def set_obs_norm(self, mean: object, std: object) -> None:
        pass


def reset_in_steps(envs: int, threads: int, cap: int) -> float:
    """S: a seeded reset of every env of a pool, in steps of the same pool (random actions)."""
    pool = onebox.envs.make("Pong-v5", envs, num_threads=threads, copy=False,
                            max_num_frames_per_episode=4 * cap)  # fmt: skip
    try:
        pool.reset(seed=0)
        t0 = time.perf_counter()
        pool.reset(seed=1000)
        reset = time.perf_counter() - t0
        actions = np.random.default_rng(0).integers(0, pool.single_action_space.n, (cap, envs))
        t0 = time.perf_counter()
        for a in actions:
            pool.step(a)
        return reset / ((time.perf_counter() - t0) / cap)
    finally:
        pool.close()


def loop_rate(envs: int, threads: int, cap: int, episodes: int) -> tuple[float, float, float]:
    """(population frames/s, env-only frames/s, the seeded resets' share of the evaluator's
    time) of two slot groups of `envs` slots with constant actions, each env playing `episodes`
    episodes per evaluation."""
    with PopulationEvaluator("Pong-v5", num_slots=2 * envs, num_threads=threads,
                             max_episode_steps=cap, episode_seeds="env") as ev:  # fmt: skip
        ev.net = ConstantActions(ev.net)
        pairs = np.ones(2 * envs * episodes, dtype=np.int64)

        def params(idx: np.ndarray) -> torch.Tensor:
            return torch.zeros(len(idx), 1)

        ev.evaluate(params, pairs[: 2 * envs], seed=1)  # makes the pools
        ev.timing.reset()
        t0 = time.perf_counter()
        frames = ev.evaluate(params, pairs, seed=2).frames
        rate = frames / (time.perf_counter() - t0)
        reset = ev.timing.fractions().get("reset", 0.0)
        return rate, env_only_rate(ev, 5.0) * ev.frames_per_step, reset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, default=32, help="envs (and slots) per slot group")
    parser.add_argument("--threads", type=int, default=2, help="engine threads per pool")
    parser.add_argument("--cap", type=int, default=300, help="episode cap in steps (L)")
    parser.add_argument("--episodes", type=int, nargs="+", default=[2, 4, 8],
                        help="episodes per env per evaluation (E)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for r in range(args.rounds):
        s = reset_in_steps(args.envs, args.threads, args.cap)
        print(f"round {r + 1}: a seeded reset of {args.envs} envs takes {s:.0f} steps' time")
        for e in args.episodes:
            rate, env_only, reset = loop_rate(args.envs, args.threads, args.cap, e)
            work = e * args.cap
            print(f"  E={e}: population {rate:,.0f} frames/s, env only {env_only:,.0f}: "
                  f"{rate / env_only:.0%} (E*L/(E*L+S) = {work / (work + s):.0%}); "
                  f"seeded resets {reset:.0%} of the evaluator's time")  # fmt: skip


if __name__ == "__main__":
    main()
