"""`onebox bench evolve`: population-evaluation throughput, in env frames/s, next to two baselines.

- population: `PopulationEvaluator.evaluate` on `population` random networks (fresh ones each
  call, one episode each), continuous batching over K slots in two pipelined groups.
- env only: the same two engine pools (same envs, batch sizes and threads) stepped with random
  actions in the same send/recv loop, with no network: the ceiling for the population number.
- one at a time: each individual alone, one env and one network forward per step (the loop a
  naive evaluator runs).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from onebox.bench import common
from onebox.evo.evaluator import PopulationEvaluator


@dataclasses.dataclass
class EvolveBenchConfig:
    """Measure population-evaluation frames/s against env-only and one-at-a-time evaluation."""

    env: str = "CartPole-v1"
    """Env id."""
    population: int = 1000
    """Networks per evaluation."""
    arch: Literal["mlp", "cnn"] = "mlp"
    """Network architecture."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden sizes."""
    num_slots: tuple[int, ...] = (256, 1024)
    """K values to measure (networks evaluated at once)."""
    num_threads: int = 1
    """Engine worker threads per slot group (two groups)."""
    torch_threads: int = 1
    """torch intra-op threads."""
    device: str = "cpu"
    """torch device of the networks."""
    seconds: float = 5.0
    """Wall time of each measurement (population: at least one whole evaluation)."""
    seed: int = 0
    """Seed of the random networks and env seeds."""
    output: Path | None = None
    """Write the results into this markdown file (e.g. docs/benchmarks.md)."""


def population_rate(config: EvolveBenchConfig, num_slots: int) -> tuple[float, float, float, int]:
    """(population frames/s, env-only frames/s with the same pools, inference time fraction,
    parameters per network)."""
    with PopulationEvaluator(
        config.env,
        arch=config.arch,
        hidden=config.hidden,
        num_slots=num_slots,
        num_threads=config.num_threads,
        device=config.device,
        max_envs=max(num_slots, config.population),
    ) as ev:
        base = config.seed
        gen = np.random.default_rng(config.seed)

        def params(idx: np.ndarray) -> torch.Tensor:
            return torch.stack([ev.net.init_params(base + int(i)) for i in idx])

        episodes = np.ones(config.population, dtype=np.int64)
        ev.evaluate(params, episodes[:num_slots], seed=1)  # warm-up, builds the pools
        ev.timing.reset()
        frames, t0 = 0, time.perf_counter()
        while True:
            frames += ev.evaluate(params, episodes, seed=int(gen.integers(2**62))).frames
            base += config.population
            elapsed = time.perf_counter() - t0
            if elapsed >= config.seconds:
                break
        split = ev.timing.fractions()
        pop = frames / elapsed
        env_only = _env_only(ev, config.seconds) * ev.frames_per_step
    return pop, env_only, split.get("inference", 0.0), ev.num_params


def _env_only(ev: PopulationEvaluator, seconds: float) -> float:
    """Env steps/s of the evaluator's own pools in its two-group send/recv loop, random actions."""
    pools = ev.pools
    for pool in pools:
        pool.async_reset()
    space = pools[0].single_action_space
    acts = [
        np.stack([space.sample() for _ in range(p.batch_size * 16)]).reshape(
            16, p.batch_size, *space.shape
        )
        for p in pools
    ]
    for p, a in zip(pools, acts, strict=True):
        for _ in range(p.num_envs // p.batch_size - 1):  # leave one batch of each in flight
            p.recv()
        ids = p.recv()[-1]["env_id"]
        p.send(a[0], ids)
    steps_per_round = sum(p.batch_size for p in pools)

    def run(k: int) -> None:
        for i in range(k):
            for p, a in zip(pools, acts, strict=True):
                ids = p.recv()[-1]["env_id"]
                p.send(a[i % 16], ids)

    timing = common.measure(run, steps_per_round, seconds, warmup=0.3)
    for p in pools:
        p.recv()
    return timing.rate


def one_at_a_time_rate(config: EvolveBenchConfig) -> float:
    """Frames/s evaluating individuals one after the other, one env, one network per step."""
    import onebox.envs
    from onebox.nn.population import PopulationNet

    env = onebox.envs.make(config.env, num_envs=1, num_threads=1, seed=config.seed)
    try:
        net = PopulationNet(
            config.arch,
            env.single_observation_space,
            env.single_action_space,
            1,
            hidden=config.hidden,
            device=config.device,
        )
        frames, i, t0 = 0, 0, time.perf_counter()
        one = slice(0, 1)
        while time.perf_counter() - t0 < config.seconds:
            net.set_slots(one, net.init_params(config.seed + i).reshape(1, -1))
            obs, _ = env.reset()
            while True:
                obs, _, term, trunc, _ = env.step(net.act(obs, one))
                frames += 1
                if term[0] or trunc[0]:
                    break
            i += 1
        return frames / (time.perf_counter() - t0)
    finally:
        env.close()


def run(config: EvolveBenchConfig) -> int:
    """Run the benchmark, print the table, write the markdown section if asked."""
    torch.set_num_threads(config.torch_threads)
    console = common.console()
    load = os.getloadavg()[0]
    single = one_at_a_time_rate(config)
    header = [
        "K slots",
        "population frames/s",
        "env-only frames/s",
        "population / env-only",
        "population / one-at-a-time",
        "inference share",
    ]
    rows = [["1 (one at a time)", common.format_rate(single), "-", "-", "1.00×", "-"]]
    macs = 0
    for k in config.num_slots:
        pop, env_only, infer, macs = population_rate(config, k)
        rows.append(
            [
                str(k),
                common.format_rate(pop),
                common.format_rate(env_only),
                f"{100 * pop / env_only:.1f}%",
                common.format_ratio(pop / single),
                f"{100 * infer:.0f}%",
            ]
        )
    title = (
        f"{config.env}: population {config.population} of {config.arch} "
        f"{'-'.join(map(str, config.hidden))}, {config.num_threads} engine thread(s) per group, "
        f"{config.torch_threads} torch thread(s), {config.device}"
    )
    from rich.table import Table

    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="left" if h == "K slots" else "right")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    if config.output is not None:
        machine = common.machine_info(("numpy", "torch"))
        command = common.command_line("onebox bench evolve", config)
        lines = [
            f"### Neuroevolution: population evaluation, {config.env}",
            "",
            title + ".",
            "",
            "Population: every env step runs its own individual's network "
            f"({macs:,} parameters, so about as many multiply-adds per step); env only: the same "
            "pools stepped with random actions, no network; one at a time: one env and one "
            "network, individual after individual. Inference share: the population run's time "
            "in the networks (including parameter copies into slots).",
            "",
            f"1-minute load average when the run began: {load:.1f} (the machine is shared).",
            "",
            common.markdown_table(header, rows, [False, True, True, True, True, True]),
            "",
            f"Command: `{command}`",
            "",
            f"Date: {common.now()}",
            "",
            "Machine:",
            "",
            *[f"- {k}: {v}" for k, v in machine.items()],
        ]
        key = f"bench:evolve:{config.env}:{config.arch}:{config.device}"
        path = common.write_section(config.output, key, "\n".join(lines))
        console.print(f"wrote the {config.env} section of {path}")
    return 0
