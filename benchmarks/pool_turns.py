"""Slot groups' pools stepped at once or in turn, on a CPU, with a GPU's inference stood in for.

Evolution's slot groups on Atari (`onebox.evo.slots`) each run in a thread: send their pool's
step, wait for it, run their networks, send again. On a GPU machine the networks leave the CPU's
cores to the envs, so the question of how to schedule the pools is one of the CPU alone. This
runs the same loop with ALE's pools and the networks replaced by a sleep of the inference time
(the thread waits as it does for the GPU, holding no core and not the GIL), and reports env
steps/s and the time with 0, 1, 2, ... pools in flight, the pools stepping at once (sharing the
cores) or in turn (one at a time, `onebox evolve --pool-turns`). Rounds interleave the modes.

    python benchmarks/pool_turns.py --groups 2 3 --envs 32 --threads 2 --inference-ms 3 6
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time

import numpy as np

import onebox.envs
from onebox.run import InFlight


def measure(groups: int, envs: int, threads: int, inference_ms: float, turns: bool,
            seconds: float) -> tuple[float, list[float]]:  # fmt: skip
    """(env steps/s, shares of the time with 0, 1, ... pools in flight) of `groups` threads,
    each stepping its own synchronous Pong pool of `envs` envs on `threads` engine threads."""
    pools = [
        onebox.envs.make(
            "Pong-v5",
            envs,
            num_threads=threads,
            episodic_life=False,
            reward_clip=False,
            max_num_frames_per_episode=1200,
        )
        for _ in range(groups)
    ]
    turn = threading.Lock() if turns else contextlib.nullcontext()
    flight, stop, steps = InFlight(), threading.Event(), [0] * groups

    for k, pool in enumerate(pools):  # before the clock: a seeded reset reloads the ROM
        pool.reset(seed=1000 * k)

    def play(k: int) -> None:
        pool, rng = pools[k], np.random.default_rng(k)
        buffer = np.zeros((envs, *pool.single_observation_space.shape), np.uint8)
        while not stop.is_set():
            time.sleep(inference_ms / 1000)  # the networks, on the GPU
            actions = rng.integers(0, pool.single_action_space.n, envs)
            with turn:
                flight.start()
                pool.send(actions)
                obs, *_ = pool.recv()
                flight.stop()
            buffer[:] = obs  # the slots' observations
            steps[k] += envs

    workers = [threading.Thread(target=play, args=(k,)) for k in range(groups)]
    flight.open()  # before any pool is sent
    for w in workers:
        w.start()
    time.sleep(1.0)  # warm-up
    flight.reset()
    before, t0 = sum(steps), time.perf_counter()
    time.sleep(seconds)
    rate = (sum(steps) - before) / (time.perf_counter() - t0)
    shares = flight.fractions()
    stop.set()
    for w in workers:
        w.join()
    flight.close()
    for pool in pools:
        pool.close()
    return rate, shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--envs", type=int, default=32, help="envs per group's pool")
    parser.add_argument("--threads", type=int, default=2, help="engine threads per pool")
    parser.add_argument("--inference-ms", type=float, nargs="+", default=[3.0, 6.0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    alone, _ = measure(1, args.envs, args.threads, 0.0, False, args.seconds)
    print(f"one pool alone, no inference: {alone:,.0f} env steps/s")
    for groups in args.groups:  # the suite's env-only: every pool, random actions, no inference
        rate, _ = measure(groups, args.envs, args.threads, 0.0, False, args.seconds)
        print(f"{groups} pools at once, no inference: {rate:,.0f} env steps/s")
    for r in range(args.rounds):
        for inference in args.inference_ms:
            for groups in args.groups:
                for turns in (False, True):
                    rate, shares = measure(groups, args.envs, args.threads, inference, turns,
                                           args.seconds)  # fmt: skip
                    flight = ", ".join(f"{k}: {100 * s:.0f}%" for k, s in enumerate(shares))
                    print(f"round {r + 1}, inference {inference:g} ms, {groups} groups, "
                          f"{'in turn' if turns else 'at once'}: {rate:,.0f} env steps/s "
                          f"({rate / alone:.2f}x one pool alone); in flight {flight}",
                          flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
