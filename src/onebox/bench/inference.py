"""`onebox bench inference`: throughput and latency of the central inference server.

Actors (threads in this process, or worker processes talking through shared memory) each send
requests of `envs_per_actor` observations in a closed loop: submit, wait for the actions, submit
again. Observations are synthetic (fixed random CartPole-shaped vectors, or with `--network
nature-cnn` random uint8 Atari frames, 4x84x84; no env is stepped), so the numbers are the
server's: batching, the policy (CleanRL's 64-64 tanh actor-critic MLP, or the Nature CNN
actor-critic, the action sampled), the hand-off to and from actors. Throughput counts the requests completed in the
window where every actor was running (after a warm-up); latency is submit-to-answer per request.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from gymnasium import spaces

from onebox.bench import common, figures
from onebox.sampling.actor_client import ActorClient
from onebox.sampling.inference import InferenceServer

SPACES = {
    "mlp": (spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2)),
    "nature-cnn": (spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6)),
}
"""Observation and action spaces of each network's synthetic requests (CartPole's, Pong's)."""


@dataclasses.dataclass
class InferenceBenchConfig:
    """Requests/s, env steps/s and p50/p99 latency of the inference server."""

    kinds: tuple[Literal["thread", "process"], ...] = ("thread", "process")
    """Actor kinds to measure."""
    actors: tuple[int, ...] = (1, 4, 16)
    """Numbers of actors."""
    max_batch: tuple[int, ...] = (256, 1024, 4096)
    """Server batch caps (envs per policy call)."""
    envs_per_actor: int = 256
    """Observations per request (the envs one actor steps at a time)."""
    timeout_ms: float = 1.0
    """How long a request waits for others to join its batch."""
    seconds: float = 2.0
    """Measured time per configuration, after `warmup`."""
    warmup: float = 0.5
    """Seconds each actor runs before the measurement window opens."""
    torch_threads: int = 1
    """torch intra-op threads of the server."""
    network: Literal["mlp", "nature-cnn"] = "mlp"
    """The policy: CleanRL's 64-64 MLP on CartPole-shaped vectors, or the Nature CNN on Atari
    frames."""
    device: str = "cpu"
    """Where the server runs the policy (`cuda` for a GPU)."""
    output: Path | None = None
    """Markdown file to write the section into (e.g. docs/benchmarks.md)."""


def policy_net(network: str, device: str, seed: int = 0) -> torch.nn.Module:
    from onebox.nn.networks import ActorCritic

    torch.manual_seed(seed)
    return ActorCritic(*SPACES[network]).to(device).eval()


def observations(network: str, envs: int, seed: int) -> np.ndarray:
    """A fixed batch of random observations of the network's space."""
    space = SPACES[network][0]
    rng = np.random.default_rng(seed)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (envs, *space.shape), dtype=np.uint8)
    return rng.standard_normal((envs, *space.shape)).astype(np.float32)


def _closed_loop(
    infer: Callable[[np.ndarray], object], obs: np.ndarray, seconds: float
) -> np.ndarray:
    """Call `infer(obs)` for `seconds`; return (completion time, latency) per request."""
    out = []
    end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        infer(obs)
        t1 = time.perf_counter()
        out.append((time.time(), t1 - t0))
        if t1 >= end:
            return np.array(out)


def process_actor(client: ActorClient, envs: int, seconds: float, path: str, network: str) -> None:
    """A process actor of the benchmark: its (completion time, latency) pairs go to `path`."""
    obs = observations(network, envs, client.actor_id)
    ids = np.arange(envs)
    np.save(path, _closed_loop(lambda o: client.infer(o, ids), obs, seconds))


@dataclasses.dataclass
class Result:
    kind: str
    actors: int
    max_batch: int
    requests_per_s: float
    env_steps_per_s: float
    p50_ms: float
    p99_ms: float
    mean_batch: float


def measure(config: InferenceBenchConfig, kind: str, actors: int, max_batch: int) -> Result:
    """Run one configuration and summarize its steady-state window."""
    envs, total = config.envs_per_actor, config.warmup + config.seconds
    policy = policy_net(config.network, config.device)
    obs_space, act_space = SPACES[config.network]

    def policy_fn(obs: torch.Tensor, actor_ids: Any, env_ids: Any) -> dict[str, torch.Tensor]:
        action, logprob, value = policy.act(obs)
        return {"actions": action, "logprobs": logprob, "values": value}

    logs: list[np.ndarray] = []
    with (
        InferenceServer(
            policy_fn,
            obs_space,
            act_space,
            max_batch,
            config.timeout_ms,
            config.device,
            max_restarts=0,
            outputs={"logprobs": ((), np.float32), "values": ((), np.float32)},
        ) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):
        if kind == "thread":

            def actor(a: int) -> None:
                obs = observations(config.network, envs, a)
                ids = np.arange(envs)
                logs.append(_closed_loop(lambda o: server.infer(a, ids, o), obs, total))

            threads = [threading.Thread(target=actor, args=(a,)) for a in range(actors)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            paths = [os.path.join(tmp, f"{a}.npy") for a in range(actors)]
            for a in range(actors):
                server.spawn(a, process_actor, envs, args=(envs, total, paths[a], config.network))
            for a in range(actors):
                server.join(a, timeout=total + 120)
            logs = [np.load(p) for p in paths]
        calls, steps = server.calls, server.env_steps
    start = max(log[0, 0] for log in logs) + config.warmup
    stop = min(log[-1, 0] for log in logs)
    if stop <= start:
        raise RuntimeError(
            "the actors did not all run at once for long enough; raise --seconds (process "
            "actors take a while to start)"
        )
    done = np.concatenate([log[(log[:, 0] >= start) & (log[:, 0] <= stop)] for log in logs])
    rate = len(done) / (stop - start)
    return Result(
        kind,
        actors,
        max_batch,
        rate,
        rate * envs,
        1e3 * float(np.percentile(done[:, 1], 50)),
        1e3 * float(np.percentile(done[:, 1], 99)),
        steps / max(calls, 1),
    )


def run(config: InferenceBenchConfig) -> int:
    """Measure every (kind, actors, max_batch) combination; print and optionally write them."""
    if config.envs_per_actor < 1 or config.seconds <= 0 or config.warmup < 0:
        raise ValueError("--envs-per-actor must be >= 1, --seconds > 0 and --warmup >= 0")
    if config.envs_per_actor > min(config.max_batch):
        raise ValueError(
            f"--envs-per-actor ({config.envs_per_actor}) must fit in every --max-batch "
            f"({min(config.max_batch)})"
        )
    torch.set_num_threads(config.torch_threads)
    console = common.console()
    load = os.getloadavg()[0]
    results = []
    for kind in config.kinds:
        for actors in config.actors:
            for max_batch in config.max_batch:
                results.append(measure(config, kind, actors, max_batch))
                r = results[-1]
                console.print(
                    f"{kind} actors={actors} max_batch={max_batch}: "
                    f"{common.format_rate(r.env_steps_per_s)} env steps/s"
                )
    load_after = os.getloadavg()[0]
    header = [
        "actors",
        "count",
        "max batch",
        "requests/s",
        "env steps/s",
        "p50 latency",
        "p99 latency",
        "mean batch",
    ]
    rows = [
        [
            r.kind,
            str(r.actors),
            str(r.max_batch),
            common.format_rate(r.requests_per_s),
            common.format_rate(r.env_steps_per_s),
            f"{r.p50_ms:.2f} ms",
            f"{r.p99_ms:.2f} ms",
            f"{r.mean_batch:.0f}",
        ]
        for r in results
    ]
    from rich.table import Table

    network = "64-64 MLP" if config.network == "mlp" else "Nature CNN"
    title = (
        f"Inference server, {network} actor-critic on {config.device}, "
        f"{config.envs_per_actor} envs per request, timeout {config.timeout_ms:g} ms, "
        f"{config.torch_threads} torch thread(s)"
    )
    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="left" if h == "actors" else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    best = max(results, key=lambda r: r.env_steps_per_s)
    verdict = (
        f"Best: {common.format_rate(best.env_steps_per_s)} env steps/s ({best.kind} actors, "
        f"{best.actors} actors, max batch {best.max_batch}); the target of 200k env steps/s is "
        + ("met." if best.env_steps_per_s >= 200e3 else "missed.")
    )
    console.print(verdict)
    if config.output is not None:
        machine = common.machine_info(("numpy", "torch"))
        lines = [
            "### Inference server throughput and latency",
            "",
            title + ". " + __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(),
            "Mean batch: envs per policy call (how much the server merged).",
            "",
            f"1-minute load average: {load:.1f} when the run began, {load_after:.1f} when it "
            "ended (the 2 cores are shared with other work).",
            "",
            common.markdown_table(header, rows, [False] + [True] * 7),
            "",
            verdict,
            "",
            f"Command: `{common.command_line('onebox bench inference', config)}`",
            "",
            f"Date: {common.now()}",
            "",
            "Machine:",
            "",
            *[f"- {k}: {v}" for k, v in machine.items()],
        ]
        groups = list(dict.fromkeys(f"{r.actors} actors" for r in results))
        values: dict[str, list[float | None]] = {}
        for r in results:
            row = values.setdefault(f"{r.kind}, max batch {r.max_batch}", [None] * len(groups))
            row[groups.index(f"{r.actors} actors")] = r.env_steps_per_s
        bars = figures.Bars(title, "env steps/s", groups, values)
        path = common.write_section(config.output, "bench:inference", "\n".join(lines), bars)
        console.print(f"wrote the inference section of {path}")
    return 0
