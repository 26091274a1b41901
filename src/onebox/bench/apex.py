"""`onebox bench apex`: how much Ape-X's actors slow its learner.

First the learner alone: Ape-X's learner (the dueling double DQN update, priorities written back)
updates from a table filled beforehand by random play, with no actor running, for `--seconds`;
then as long beside an inference client, a thread in its process asking the learner's inference
server for one actor's actions back to back (what the actors' requests alone cost the learner).
Then `onebox train apex` with 1, 2, 4 actors (`--actors`), each for `--total-steps` env steps:
its updates/s and env steps/s over the learning phase, from the run's own logs (an update count
every 100 updates). All runs use the env family's preset, as `onebox train apex` does by
default (on classic control: a rate limit of 16 sampled transitions per inserted one), or
`--samples-per-insert`. Rounds are interleaved (the learner alone, then each actor count) and
the table gives medians, so that a drift in the machine's load hits all alike.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from onebox.bench import common, figures


@dataclasses.dataclass
class ApexBenchConfig:
    """Ape-X learner updates/s alone and with 1, 2, 4 actors stepping beside it."""

    env: str = "CartPole-v1"
    """Env id."""
    actors: tuple[int, ...] = (1, 2, 4)
    """Actor counts to measure."""
    total_steps: int = 40_000
    """Env steps per Ape-X run (its learning phase starts at the preset's learning_starts)."""
    seconds: float = 10.0
    """How long the learner alone updates."""
    samples_per_insert: float | None = None
    """Rate limit of every run (default: the preset's)."""
    torch_threads: int | None = None
    """Torch CPU threads (default: the preset's)."""
    process_actors: bool = False
    """Run the actors in processes (`onebox train apex --process-actors`), not threads."""
    inference: Literal["central", "local"] = "central"
    """Where the actors' actions come from (`onebox train apex --inference`): the learner's
    inference server, or each actor's own copy of the network."""
    rounds: int = 3
    """Interleaved rounds."""
    output: Path | None = None
    """Markdown file to write the section into (e.g. docs/benchmarks.md)."""


def base_config(config: ApexBenchConfig, actors: int, root: Path, name: str):  # type: ignore[no-untyped-def]
    """The resolved Ape-X config of one measurement."""
    from onebox.algos import apex

    fields = {"samples_per_insert": config.samples_per_insert,
              "torch_threads": config.torch_threads}  # fmt: skip
    return apex.resolve(apex.Config(
        env=config.env, actors=actors, total_steps=config.total_steps, runs_dir=str(root),
        name=name, checkpoint_minutes=0.0, progress=False, process_actors=config.process_actors,
        inference=config.inference,
        **{k: v for k, v in fields.items() if v is not None},
    ))  # fmt: skip


def learner_alone(config: ApexBenchConfig, root: Path, client: bool = False) -> tuple[float, float]:
    """(updates/s, requests/s) of Ape-X's learner on a table of random play, no actor running;
    with `client`, a thread in this process asks the learner's inference server for one actor's
    actions back to back meanwhile (what actors' requests alone cost the learner)."""
    import onebox.envs
    from onebox.algos import apex, offpolicy
    from onebox.sampling.inference import InferenceServer

    c = base_config(config, 1, root, "alone")
    torch.set_num_threads(c.torch_threads)
    rng = np.random.default_rng(0)
    with onebox.envs.make(c.env, c.num_envs, autoreset_mode="SameStep", seed=0) as envs:
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        learner = apex.ApeX(c, obs_space, act_space, torch.device("cpu"))
        channel = learner.make_channel(obs_space, act_space)
        obs, _ = envs.reset(seed=0)
        buffer = channel.buffer
        while len(buffer) < 2 * max(1, c.learning_starts):
            actions = rng.integers(act_space.n, size=envs.num_envs)
            nxt, rewards, term, trunc, info = envs.step(actions)
            ends = np.logical_or(term, trunc)
            buffer.add(obs, actions, rewards, term, trunc, offpolicy.true_next_obs(nxt, ends, info))
            obs = nxt
    stop, requests = threading.Event(), [0]
    with InferenceServer(learner.policy, obs_space, act_space, outputs=learner.outputs) as server:
        learner.updating = server.updating

        def ask() -> None:
            ids, batch = np.arange(obs.shape[0]), np.ascontiguousarray(obs)
            while not stop.is_set():
                server.infer(0, ids, batch)
                requests[0] += 1

        def update(k: int) -> None:
            for _ in range(k):
                learner.update(channel.take(lambda: False))

        thread = threading.Thread(target=ask, daemon=True)
        if client:
            thread.start()
        try:
            t0, n0 = time.perf_counter(), requests[0]
            rate = common.measure(update, 1, config.seconds, warmup=1.0).rate
            asked = (requests[0] - n0) / (time.perf_counter() - t0)
        finally:
            stop.set()
            if client:
                thread.join()
        return rate, asked


def with_actors(config: ApexBenchConfig, actors: int, root: Path, k: int) -> tuple[float, float]:
    """(updates/s, env steps/s) of `onebox train apex` with `actors` actors, learning phase."""
    from onebox.algos import driver

    c = base_config(config, actors, root, f"actors{actors}-{k}")
    rates = learning_rates(driver.train(c) / "metrics.csv")
    if rates is None:
        raise ValueError(
            f"--total-steps {config.total_steps} is too short: the run with {actors} actor(s) "
            "logged its learner updates fewer than twice; give it more steps"
        )
    return rates


def learning_rates(metrics: Path) -> tuple[float, float] | None:
    """(updates/s, env steps/s) of an actor-learner run between the first and the last of its
    update counts in `metrics` (its metrics.csv), or None if it logged fewer than two."""
    if not metrics.is_file():
        return None
    with open(metrics) as f:
        rows = [r for r in csv.DictReader(f) if r["tag"] == "charts/updates"]
    if len(rows) < 2 or rows[0]["time"] == rows[-1]["time"]:
        return None
    (s0, t0, u0), (s1, t1, u1) = [(int(r["step"]), float(r["time"]), float(r["value"]))
                                  for r in (rows[0], rows[-1])]  # fmt: skip
    return (u1 - u0) / (t1 - t0), (s1 - s0) / (t1 - t0)


def run(config: ApexBenchConfig) -> int:
    """Run the rounds, print the table, write the markdown section if asked."""
    if config.rounds <= 0 or config.seconds <= 0 or not config.actors:
        raise ValueError("--rounds, --seconds and --actors must be positive")
    console = common.console()
    loads = [os.getloadavg()[0]]
    alone: list[float] = []
    client: list[tuple[float, float]] = []
    runs: dict[int, list[tuple[float, float]]] = {a: [] for a in config.actors}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(config.rounds):
            alone.append(learner_alone(config, Path(tmp))[0])
            console.print(f"round {k + 1}: learner alone {alone[-1]:.0f} updates/s")
            client.append(learner_alone(config, Path(tmp), client=True))
            console.print(f"round {k + 1}: learner beside a client {client[-1][0]:.0f} updates/s")
            for a in config.actors:
                runs[a].append(with_actors(config, a, Path(tmp), k))
                console.print(f"round {k + 1}: {a} actor(s) {runs[a][-1][0]:.0f} updates/s")
            loads.append(os.getloadavg()[0])
    base = statistics.median(alone)
    c = base_config(config, 1, Path("."), "x")
    header = ["learner", "updates/s (median)", "range", "env steps/s", "× alone"]
    rows = [["alone (no actors)", f"{base:.0f}", f"{min(alone):.0f}-{max(alone):.0f}", "-",
             "1.00×"]]  # fmt: skip
    ups = [u for u, _ in client]
    rows.append([
        "alone, beside an inference client", f"{statistics.median(ups):.0f}",
        f"{min(ups):.0f}-{max(ups):.0f}",
        common.format_rate(c.envs_per_actor * statistics.median(r for _, r in client)),
        common.format_ratio(statistics.median(ups) / base),
    ])  # fmt: skip
    for a, results in runs.items():
        ups = [u for u, _ in results]
        rows.append([
            f"Ape-X, {a} actor(s)", f"{statistics.median(ups):.0f}",
            f"{min(ups):.0f}-{max(ups):.0f}",
            common.format_rate(statistics.median(s for _, s in results)),
            common.format_ratio(statistics.median(ups) / base),
        ])  # fmt: skip
    common.print_table(console, f"Ape-X learner updates/s on {config.env}", header, rows)
    console.print(f"{time.perf_counter() - started:.0f} s in all")
    if config.output is not None:
        kind = "process" if config.process_actors else "thread"
        lines = [
            f"### Ape-X learner with its {kind} actors, {config.inference} inference, {config.env}",
            "",
            f"The preset's learner (batch {c.batch_size}, {c.envs_per_actor} envs per actor, "
            f"unrolls of {c.unroll}, rate limit {c.samples_per_insert} sampled transitions per "
            f"inserted one, {c.torch_threads} torch thread(s)) alone for {config.seconds:.0f} s, "
            "then as long beside an inference client (a thread in its process asking its "
            f"inference server for {c.envs_per_actor} envs' actions back to back: env steps/s "
            "is what it was served), "
            f"then `onebox train apex` for {config.total_steps} steps per actor count; "
            f"{config.rounds} interleaved rounds (see `onebox/bench/apex.py`).",
            "",
            "1-minute load average: "
            + ", ".join(f"{x:.1f}" for x in loads)
            + " (at the start and after each round; the 2 cores are shared with other work).",
            "",
            common.markdown_table(header, rows, [False] + [True] * (len(header) - 1)),
            "",
            *common.provenance("onebox bench apex", config, ("numpy", "torch")),
        ]
        key = f"bench:apex:{config.env}" + (":process" if config.process_actors else "")
        key += ":local" if config.inference == "local" else ""
        bars = figures.Bars(f"Ape-X learner updates/s on {config.env}", "updates/s (median)",
                            [config.env], {row[0]: [float(row[1])] for row in rows})  # fmt: skip
        path = common.write_section(config.output, key, "\n".join(lines), bars)
        console.print(f"wrote the {config.env} section of {path}")
    return 0
