"""`onebox bench evolve`: population-evaluation throughput, in env frames/s, next to two baselines.

- population: `PopulationEvaluator.evaluate` on `population` random networks (fresh ones each
  call, one episode each), continuous batching over K slots in pipelined groups
  (`--slot-groups`, two by default).
- env only: the same engine pools (same envs, batch sizes and threads) stepped with random
  actions in the same send/recv loop, with no network: the ceiling for the population number.
- one at a time: each individual alone, one env and one network forward per step (the loop a
  naive evaluator runs), each episode with its own seeded reset as in the population run.

Atari mode (`--env Pong-v5`, or any Atari id): Nature CNN populations; the defaults shrink to a
CPU-sized run (population 16, K 8 and 16). The envs play whole games with the true score, as in
evolution, and the section also gives the wall time of one seeded reset (ALE reloads the ROM for
each episode so that fitnesses do not depend on K).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

import onebox.envs
from onebox.bench import common, figures
from onebox.evo.evaluator import EpisodeSeeds, PopulationEvaluator
from onebox.nn.population import ConvImpl, PopulationNet, default_arch


@dataclasses.dataclass
class EvolveBenchConfig:
    """Measure population-evaluation frames/s against env-only and one-at-a-time evaluation."""

    env: str = "CartPole-v1"
    """Env id (an Atari id, e.g. Pong-v5, measures Nature CNN populations)."""
    population: int | None = None
    """Networks per evaluation (default: 1000; 16 with the cnn)."""
    arch: Literal["mlp", "cnn", "minatar"] | None = None
    """Network architecture (default: the cnn for image observations, minatar for MinAtar's bool
    grids, else the mlp)."""
    hidden: tuple[int, ...] = ()
    """Hidden sizes (default: 64 64 for the mlp, 512 for the cnn, 128 for minatar)."""
    num_slots: tuple[int, ...] = ()
    """K values to measure, networks evaluated at once (default: 256 1024; 8 16 with the cnn)."""
    max_episode_steps: int | None = None
    """Episode cap in env steps (default: the env's own limit)."""
    slot_groups: int = 2
    """Pipelined slot groups, each with its own engine pool (as `onebox evolve --slot-groups`)."""
    num_threads: int = 1
    """Engine worker threads per slot group."""
    pool_turns: bool | None = None
    """Atari: the groups' pools step one at a time (as `onebox evolve --pool-turns`; default: in
    turn with the networks on a GPU)."""
    torch_threads: int = 1
    """torch intra-op threads."""
    device: str = "cpu"
    """torch device of the networks."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Network precision (as `onebox evolve --dtype`)."""
    seconds: float = 5.0
    """Wall time of each measurement (population: at least one whole evaluation)."""
    episode_seeds: EpisodeSeeds = "pair"
    """How episodes are seeded (as `onebox evolve --episode-seeds`; `env` is for Atari)."""
    seed: int = 0
    """Seed of the random networks and env seeds."""
    output: Path | None = None
    """Write the results into this markdown file (e.g. docs/benchmarks.md)."""


def _spaces(env_id: str) -> tuple[Any, Any]:
    """(observation space, action space) of one env of `env_id`."""
    probe = onebox.envs.make(env_id, num_envs=1, num_threads=1)
    try:
        return probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()


def resolve(config: EvolveBenchConfig) -> EvolveBenchConfig:
    """`config` with the defaults that depend on the env (architecture, sizes) filled in."""
    arch = config.arch or default_arch(_spaces(config.env)[0])
    cnn = arch == "cnn"
    return dataclasses.replace(
        config,
        arch=arch,
        population=config.population or (16 if cnn else 1000),
        hidden=tuple(config.hidden) or {"cnn": (512,), "minatar": (128,)}.get(arch, (64, 64)),
        num_slots=tuple(config.num_slots) or ((8, 16) if cnn else (256, 1024)),
    )


def _evaluator(
    config: EvolveBenchConfig, num_slots: int, num_threads: int, native_rollout: bool = False
) -> PopulationEvaluator:
    """The evaluator measured: its slot groups (or, with `native_rollout`, the engine's rollouts
    where the network fits them)."""
    population = config.population or 0
    return PopulationEvaluator(
        config.env,
        arch=config.arch,
        hidden=config.hidden,
        num_slots=num_slots,
        slot_groups=config.slot_groups,
        num_threads=num_threads,
        max_episode_steps=config.max_episode_steps,
        device=config.device,
        dtype=config.dtype,
        max_envs=max(num_slots, population),
        native_rollout=native_rollout,
        episode_seeds=config.episode_seeds,
        pool_turns=config.pool_turns,
    )


def _population_frames(ev: PopulationEvaluator, config: EvolveBenchConfig, warmup: int) -> float:
    """Frames/s of whole-population evaluations for `config.seconds` (at least one), after a
    warm-up evaluation of `warmup` individuals (which builds the pools)."""
    base = config.seed
    gen = np.random.default_rng(config.seed)

    def params(idx: np.ndarray) -> torch.Tensor:
        return torch.stack([ev.net.init_params(base + int(i), ev.net.device) for i in idx])

    episodes = np.ones(config.population or 0, dtype=np.int64)
    ev.evaluate(params, episodes[:warmup], seed=1)
    ev.timing.reset()
    ev.in_flight.reset()
    frames, t0 = 0, time.perf_counter()
    while True:
        frames += ev.evaluate(params, episodes, seed=int(gen.integers(2**62))).frames
        base += len(episodes)
        elapsed = time.perf_counter() - t0
        if elapsed >= config.seconds:
            return frames / elapsed


def rollout_rate(config: EvolveBenchConfig) -> float | None:
    """Frames/s of the evaluator's native-rollout path (the network in C++, whole episodes), or
    None where the network does not fit it."""
    groups = config.slot_groups
    with _evaluator(config, groups, groups * config.num_threads, native_rollout=True) as ev:
        return _population_frames(ev, config, config.population or 0) if ev.rollout_ok else None


@dataclasses.dataclass
class PopulationRate:
    """What `population_rate` measured."""

    frames: float
    """Population frames/s."""
    env_only: float
    """Frames/s of the same pools with random actions."""
    split: dict[str, float]
    """The evaluator's time split: shares of "env", "reset", "turn", "inference", "params" and
    "other" (see `PopulationEvaluator.timing`)."""
    in_flight: list[float]
    """Shares of the population run's time with 0, 1, ... of the groups' pools in flight (see
    `PopulationEvaluator.in_flight`)."""
    one_pool: float | None
    """Frames/s of one group's pool stepped alone with random actions (asked for: about the
    most pools stepped in turn can make), or None."""
    params: int
    """Parameters per network."""
    pool_turns: bool
    """Whether the groups' pools stepped in turn (`PopulationEvaluator.pool_turns`)."""

    def in_flight_text(self) -> str:
        """The in-flight shares as "0: 5%, 1: 30%, 2: 65%"."""
        return ", ".join(f"{k}: {100 * f:.0f}%" for k, f in enumerate(self.in_flight))


def population_rate(
    config: EvolveBenchConfig, num_slots: int, one_pool: bool = False
) -> PopulationRate:
    """Population frames/s with `num_slots` slots, next to env-only frames/s of the same pools
    (and, with `one_pool`, of one of them alone)."""
    with _evaluator(config, num_slots, config.num_threads) as ev:
        pop = _population_frames(ev, config, warmup=num_slots)
        split, in_flight = ev.timing.fractions(), ev.in_flight.fractions()
        env_only = env_only_rate(ev, config.seconds) * ev.frames_per_step
        alone = env_only_rate(ev, config.seconds, 1) * ev.frames_per_step if one_pool else None
    return PopulationRate(pop, env_only, split, in_flight, alone, ev.num_params, ev.pool_turns)


def env_only_rate(ev: PopulationEvaluator, seconds: float, pools: int | None = None) -> float:
    """Env steps/s of the evaluator's own pools (one per slot group; the first `pools` of them)
    in its send/recv loop, random actions."""
    pools = ev.pools[:pools]
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
    rounds = itertools.cycle(range(16))

    def run(k: int) -> None:  # across calls too: slow envs are timed one call at a time
        for _ in range(k):
            i = next(rounds)
            for p, a in zip(pools, acts, strict=True):
                ids = p.recv()[-1]["env_id"]
                p.send(a[i], ids)

    timing = common.measure(run, steps_per_round, seconds, warmup=0.3)
    for p in pools:
        p.recv()
    return timing.rate


def forward_ms(config: EvolveBenchConfig, num_slots: int, conv: ConvImpl) -> float:
    """Milliseconds per call of the population forward alone, `num_slots` random networks each on
    its own random observation already on the device, actions fetched to the host (what the
    evaluator's inference costs per group step, loading parameters aside)."""
    obs_space, act_space = _spaces(config.env)
    net = PopulationNet(config.arch or default_arch(obs_space), obs_space, act_space, num_slots,
                        hidden=config.hidden, device=config.device, dtype=config.dtype,
                        conv=conv)  # fmt: skip
    net.set_slots(
        slice(None), torch.stack([net.init_params(i, net.device) for i in range(num_slots)])
    )
    obs_space.seed(config.seed)
    obs = torch.as_tensor(
        np.stack([obs_space.sample() for _ in range(num_slots)]), device=net.device
    )
    every = slice(0, num_slots)
    return 1e3 / common.measure(lambda k: [net.act(obs, every) for _ in range(k)], 1,
                                config.seconds).rate  # fmt: skip


def one_at_a_time_rate(config: EvolveBenchConfig) -> float:
    """Frames/s evaluating individuals one after the other, one env, one network per step (the
    evaluator's env options and network, slot 0)."""
    with _evaluator(config, config.slot_groups, 1) as ev:  # one slot per group
        env = ev.make_env(1)
        try:
            net = ev.net
            frames, i, t0 = 0, 0, time.perf_counter()
            one = slice(0, 1)
            while time.perf_counter() - t0 < config.seconds:
                net.set_slots(one, net.init_params(config.seed + i, net.device).reshape(1, -1))
                obs, _ = env.reset(seed=config.seed + i)
                while True:
                    obs, _, term, trunc, _ = env.step(net.act(obs, one))
                    frames += ev.frames_per_step
                    if term[0] or trunc[0]:
                        break
                i += 1
            return frames / (time.perf_counter() - t0)
        finally:
            env.close()


def seeded_reset_seconds(config: EvolveBenchConfig, repeats: int = 5) -> float:
    """Wall seconds of a seeded reset of one env of two (what starts each Atari episode)."""
    with _evaluator(config, config.slot_groups, 1) as ev:  # one slot per group
        env = ev.make_env(2)
        try:
            env.reset(seed=config.seed)
            t0 = time.perf_counter()
            for k in range(repeats):
                env.reset_envs([0], config.seed + k)
            return (time.perf_counter() - t0) / repeats
        finally:
            env.close()


def run(config: EvolveBenchConfig) -> int:
    """Run the benchmark, print the table, write the markdown section if asked."""
    torch.set_num_threads(config.torch_threads)
    console = common.console()
    load = os.getloadavg()[0]
    config = resolve(config)
    single = one_at_a_time_rate(config)
    header = [
        "K slots",
        "population frames/s",
        "env-only frames/s",
        "population / env-only",
        "population / one-at-a-time",
        "inference share",
        "params share",
        "other share",
        "turn share",
        "reset share",
        "time with 0, 1, ... pools in flight",
    ]
    rows = [["1 (one at a time)", common.format_rate(single), "-", "-", "1.00×", "-", "-", "-",
             "-", "-", "-"]]  # fmt: skip
    params, turns = 0, False
    groups, population, env_only = ["1 (one at a time)"], [single], [None]
    for k in config.num_slots:
        r = population_rate(config, k)
        groups.append(f"{k} slots")
        population.append(r.frames)
        env_only.append(r.env_only)
        params, turns = r.params, r.pool_turns
        rows.append(
            [
                str(k),
                common.format_rate(r.frames),
                common.format_rate(r.env_only),
                f"{100 * r.frames / r.env_only:.1f}%",
                common.format_ratio(r.frames / single),
                f"{100 * r.split.get('inference', 0.0):.0f}%",
                f"{100 * r.split.get('params', 0.0):.0f}%",
                f"{100 * r.split.get('other', 0.0):.0f}%",
                f"{100 * r.split.get('turn', 0.0):.0f}%",
                f"{100 * r.split.get('reset', 0.0):.0f}%",
                r.in_flight_text(),
            ]
        )
    rollout = rollout_rate(config)
    if rollout is not None:
        groups.append("native rollout")
        population.append(rollout)
        env_only.append(None)
        rows.append(
            ["native rollout", common.format_rate(rollout), "-", "-",
             common.format_ratio(rollout / single), "-", "-", "-", "-", "-", "-"]
        )  # fmt: skip
    title = (
        f"{config.env}: population {config.population} of {config.arch} "
        f"{'-'.join(map(str, config.hidden))}, {config.slot_groups} slot groups of "
        f"{config.num_threads} engine thread(s) each"
        f"{', stepped in turn' if turns else ''}, "
        f"{config.torch_threads} torch thread(s), {config.device}, {config.dtype}, episode seeds "
        f"{config.episode_seeds}"
    )
    from rich.table import Table

    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="left" if h == "K slots" else "right")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    notes = []
    if onebox.envs.backend_of(config.env) == "atari":
        reset = seeded_reset_seconds(config)
        starts = (
            "Each episode starts with a seeded reset, for which ALE reloads the ROM"
            if config.episode_seeds == "pair"
            else "Episode seeds `env`: each env starts an evaluation with a seeded reset, for "
            "which ALE reloads the ROM, and its later episodes with unseeded ones"
        )
        notes = [
            f"{starts}; a seeded reset takes {1000 * reset:.0f} ms of wall time for one env "
            "here (env only resets without a seed). Games are whole (no episodic life), as in "
            "evolution.",
            "",
        ]
        console.print(notes[0])
    if config.output is not None:
        machine = common.machine_info(("numpy", "torch"))
        command = common.command_line("onebox bench evolve", config)
        lines = [
            f"### Neuroevolution: population evaluation, {config.env}",
            "",
            title + ".",
            "",
            "Population: every env step runs its own individual's network "
            f"({params:,} parameters); env only: the same "
            "pools stepped with random actions, no network; one at a time: one env and one "
            "network, individual after individual. Inference share: the population run's time "
            "in the networks (including parameter copies into slots); turn share: waiting for "
            "the turn to step (Atari pools stepped in turn, `--pool-turns`); reset share: in "
            "seeded resets (each episode's, or with episode seeds `env` each env's first of an "
            "evaluation). Pools in flight: "
            "sent and "
            "not yet received (stepping; with native pools, which one thread drives, also done "
            "and waiting for that thread). Native rollout (where the "
            "network fits: a native env and a linear or one-tanh-layer mlp): the evaluator's "
            "other path, whole episodes in the engine with the network in C++, on all the groups' "
            "threads.",
            "",
            *notes,
            f"1-minute load average when the run began: {load:.1f} (the machine is shared).",
            "",
            common.markdown_table(
                header, rows, [False, True, True, True, True, True, True, True, True, True, False]
            ),
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
        if config.dtype != "float32":
            key += f":{config.dtype}"
        if config.episode_seeds != "pair":
            key += f":{config.episode_seeds}-seeds"
        bars = figures.Bars(title, "frames/s", groups,
                            {"population": population, "env only": env_only})  # fmt: skip
        path = common.write_section(config.output, key, "\n".join(lines), bars)
        console.print(f"wrote the {config.env} section of {path}")
    return 0
