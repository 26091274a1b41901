"""The actor-learner loop of IMPALA, APPO and Ape-X: actors feed a channel, a learner consumes it.

    env pools -> actors (threads or processes) -> channel (FIFO or replay) -> learner
                   ^                  |
                   +--- inference ----+   (the central server batches every actor's requests)

A learner module supplies a `Setup`: what each actor runs (`ActorSpec`), the channel between
actors and learner (`onebox.sampling.channels`), and the `Learner` itself: the policy the
inference server serves (named outputs: actions and what the learner records), `update(batch,
server)` for one learner step on what the channel gives, and its state for checkpoints. This
module does the rest, the same for all of them: the inference server and thread or process
actors, on a `RunSession` (run folder, logs, progress bar, checkpoints, Ctrl-C and resume).

The run ends once `Setup.total_steps` env steps have reached the learner through the channel.
Env states cannot be saved: on resume the actors' envs restart from seeds no earlier run used.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from onebox import cluster, run
from onebox.algos import offpolicy
from onebox.algos.common import parse_env_options, setup_torch
from onebox.sampling.actors import ACTOR_SECTIONS, ActorSpec, ProcessActors, ThreadActor
from onebox.sampling.channels import ReplayChannel
from onebox.sampling.inference import CALL_SECTIONS, InferenceServer, OutputSpec, PolicyFn
from onebox.sampling.policies import SharedWeights, Weights
from onebox.sampling.server_process import ServerProcess


class Learner(Protocol):
    """What the loop needs of a learner."""

    net: torch.nn.Module
    """The network the actors' policy runs (IMPALA's local actors copy it)."""
    policy: PolicyFn
    """What the inference server serves (see `onebox.sampling.inference.PolicyFn`)."""
    outputs: OutputSpec
    """The policy's outputs besides actions, as actors record them."""

    def update(self, batch: Any, server: InferenceServer | ServerProcess) -> dict[str, float]:
        """One learner step on what the channel's `take` gave; changes the weights inside
        `server.updating()` (and reads `server.version`). Returns the stats to log."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Channel(Protocol):
    """The seam between actors and learner (see `onebox.sampling.channels`)."""

    def put(self, actor: int, unroll: Any, stop: Any) -> None: ...

    def take(self, check: Callable[[], bool]) -> Any: ...

    def progress(self) -> tuple[int, list[float], list[int]]: ...


@dataclasses.dataclass
class ActorFields:
    """The config fields of the actors and the inference server, shared by every learner on
    this loop (IMPALA, APPO, Ape-X, R2D2)."""

    process_actors: bool = False
    """Run each actor in its own process (its env pool included), talking to the inference
    server through shared memory; an actor that dies is restarted."""
    actor_restarts: int = 3
    """With `--process-actors` or `--ray`: how often one actor (or actor host) may be restarted
    before the run fails."""
    ray: str | None = None
    """Run the actors on the Ray cluster at this address (HOST:PORT, as `ray start --head`
    prints it, or `auto`: the cluster of this machine), each host with its own copy of the
    policy; the learner (and its replay table) stay in this process. Needs
    `pip install "onebox[ray]"`; see docs/cluster.md."""
    actor_hosts: int | None = None
    """With `--ray`: Ray actor processes that run the `--actors` between them (default: one per
    node of the cluster)."""
    max_batch: int = 1024
    """Inference server: most envs per forward pass."""
    timeout_ms: float = 0.0
    """Inference server: how long a request may wait for others to join its batch (0: each
    policy call takes whatever requests wait, up to `--max-batch`; on an H200 with 8 thread
    actors of 16 Pong envs, waiting 1 ms made APPO 1.56x slower for no larger batches,
    docs/benchmarks.md)."""
    num_threads: int | None = None
    """Env pool threads per actor (default: this machine's physical cores shared among the
    actors, at least 1 each); with `--env-splits`, per pool."""
    env_splits: int = 1
    """Pools each actor's envs are split into, stepped in turn: while one waits for its actions
    the others step (Sample Factory's double-buffered sampling: 2). Must divide
    `--envs-per-actor`; the unrolls are the same as with one pool."""
    inference: Literal["central", "local"] | None = None
    """`central`: every step's actions come from the learner's inference server, which batches
    all actors' requests into one forward pass (SEED RL); `local`: each actor runs its own copy
    of the network (on the CPU in process actors and on Ray hosts), reloaded whenever the
    learner has published newer weights, every `--sync-every` updates (IMPALA's and Ape-X's
    actors). Default: central; local with `--ray`."""
    sync_every: int = 1
    """With `--inference local` or `--server-process`: learner updates between two publishes
    of the weights."""
    server_process: bool = False
    """With `--process-actors` and central inference: run the inference server in a process of
    its own, the actors' processes its children (Sample Factory's policy worker), so that its
    thread shares no GIL with the learner's; it serves the weights the learner publishes every
    `--sync-every` updates."""
    server_processes: int = 1
    """With `--server-process`: how many server processes, each serving every N-th actor with
    batches of its own (Sample Factory's policy workers per policy), where one server's work per
    call on the host bounds the actors; at most `--actors`."""


def resolve_actors(config: Any) -> Any:
    """Check a config's `ActorFields` (after its preset filled `actors` and `envs_per_actor`)
    and fill `inference`; raise ValueError before any work starts."""
    if config.envs_per_actor > config.max_batch:
        raise ValueError(
            f"--envs-per-actor ({config.envs_per_actor}) must be <= --max-batch ({config.max_batch})"
        )
    if config.env_splits < 1 or config.envs_per_actor % config.env_splits:
        raise ValueError(
            f"--env-splits ({config.env_splits}) must be a positive divisor of --envs-per-actor "
            f"({config.envs_per_actor}): each split is a pool of the same number of envs"
        )
    if config.actor_restarts < 0:
        raise ValueError(f"--actor-restarts must be >= 0, got {config.actor_restarts}")
    if config.timeout_ms < 0:
        raise ValueError(f"--timeout-ms must be >= 0, got {config.timeout_ms}")
    if config.sync_every <= 0:
        raise ValueError(f"--sync-every must be positive, got {config.sync_every}")
    cluster.check_flags(config.ray, config.actor_hosts, "--actor-hosts",
                        {"--process-actors": config.process_actors,
                         "--inference central": config.inference == "central"},
                        config.actors)  # fmt: skip
    if config.inference is None:
        config = dataclasses.replace(config, inference="central" if config.ray is None else "local")
    if config.server_process and not (config.process_actors and config.inference == "central"):
        raise ValueError(
            "--server-process runs the inference server beside process actors: add "
            "--process-actors (with central inference, the default), or drop --server-process"
        )
    if (
        isinstance(config.server_processes, bool)
        or not isinstance(config.server_processes, int)
        or not 1 <= config.server_processes <= config.actors
    ):
        raise ValueError(
            f"--server-processes must be an integer from 1 to --actors ({config.actors}): each "
            f"server process serves at least one actor; got {config.server_processes!r}"
        )
    if config.server_processes > 1 and not config.server_process:
        raise ValueError(
            "--server-processes is how many processes --server-process runs: add "
            "--server-process (with --process-actors), or drop --server-processes"
        )
    return config


def actors_net(config: Any, net: torch.nn.Module) -> torch.nn.Module:
    """The network that actor-side policies (`Setup.local`) copy: a CPU copy for process actors
    and Ray hosts with `--inference local`, which must neither open the learner's GPU nor need
    one; else the learner's own (thread actors copy it on its device; central inference never
    calls `Setup.local`)."""
    if config.inference == "local" and (config.process_actors or config.ray is not None):
        return copy.deepcopy(net).cpu()
    return net


def server_batch(config: Any) -> int:
    """The inference server's largest batch: one request from every actor it serves (with
    `--server-processes N`, every N-th), at most `--max-batch`. An actor asks for one of its env
    splits at a time, so a batch is full once every actor has asked, and none then waits out
    `--timeout-ms`."""
    servers = config.server_processes if config.server_process else 1
    served = -(-config.actors // servers)  # the most actors one server has
    return min(config.max_batch, served * (config.envs_per_actor // config.env_splits))


HOST_SECTIONS = tuple(k for k in CALL_SECTIONS if k != "device")
"""The parts of a policy call the server thread works through on the host."""


class ServerStats:
    """The inference server's charts between two logs: `charts/inference_batch` (envs per
    policy call), `charts/inference_latency_ms` (a request's mean time in the server, waiting
    for its batch and its policy call), `charts/inference_busy` (the share of the time in
    policy calls; with several server processes, their mean), the shares of the calls' time in
    each of their parts
    (`charts/inference_gather`, `_policy`, `_device`, `_answer`: see
    `onebox.sampling.inference.CALL_SECTIONS`) and `charts/inference_on_core`: the share of the
    calls' time on the host (all but `device`) that the server thread ran on a core, not
    waiting (for the GIL, a core, the learner's weight update). Only the server thread's own CPU
    time counts: on a CPU device with several torch threads the forward's work in torch's other
    threads does not, and the share reads low there (on this 2-core machine, APPO on Pong: 92%
    with `--torch-threads 1`, 43% with 2)."""

    def __init__(self, server: InferenceServer | ServerProcess) -> None:
        self.server = server
        self.servers = server.counters()["servers"]
        self.last = self._now()

    def _now(self) -> tuple[float, ...]:
        c = self.server.counters()
        wall, cpu = c["split"], c["split_cpu"]
        return (time.perf_counter(), c["calls"], c["env_steps"], c["requests"],
                c["request_seconds"], *(wall[k] for k in CALL_SECTIONS),
                sum(cpu[k] for k in HOST_SECTIONS))  # fmt: skip

    def update(self) -> dict[str, float]:
        """The charts since the last call (none where no call was made)."""
        now = self._now()
        wall, calls, steps, requests, waited, *parts, cpu = (
            a - b for a, b in zip(now, self.last, strict=True)
        )
        self.last = now
        if not calls:
            return {}
        timed = dict(zip(CALL_SECTIONS, parts, strict=True))
        busy, host = sum(timed.values()), sum(timed[k] for k in HOST_SECTIONS)
        charts = {"charts/inference_batch": steps / calls,
                  "charts/inference_latency_ms": 1000 * waited / requests,
                  "charts/inference_busy": busy / (wall * self.servers)}  # fmt: skip
        if busy > 0:
            charts.update({f"charts/inference_{k}": v / busy for k, v in timed.items()})
        if host > 0:
            charts["charts/inference_on_core"] = min(1.0, cpu / host)
        return charts


class ActorStats:
    """Thread and process actors' charts between two logs: the shares of their time in their env
    pools (`charts/actor_env`), waiting for actions (`charts/actor_inference`), waiting for the
    learner to take their unrolls (`charts/actor_blocked`) and the rest of their loop
    (`charts/actor_other`: recording, and waiting for the GIL in threads). `totals()` gives each
    actor's seconds per section so far (a restarted process actor's start again from 0)."""

    def __init__(self, totals: Callable[[], list[dict[str, float]]]) -> None:
        self.totals = totals
        self.last, self.seen = time.perf_counter(), totals()

    def update(self) -> dict[str, float]:
        """The charts since the last call (none without actors that report their time)."""
        now, current = time.perf_counter(), self.totals()
        wall = (now - self.last) * len(current)
        seen = self.seen + [{}] * (len(current) - len(self.seen))
        self.last, self.seen = now, current
        if wall <= 0:
            return {}
        timed = dict.fromkeys(ACTOR_SECTIONS, 0.0)
        for before, after in zip(seen, current, strict=True):
            for k in ACTOR_SECTIONS:
                delta = after.get(k, 0.0) - before.get(k, 0.0)
                timed[k] += delta if delta >= 0 else after.get(k, 0.0)  # restarted: a new life
        timed["other"] = max(0.0, wall - sum(timed.values()))
        total = sum(timed.values())  # the wall time, or more where a section spans two logs
        return {f"charts/actor_{k}": v / total for k, v in timed.items()}


def actors_note(config: Any) -> str:
    """Where a run's actors run and where their actions come from, for its log."""
    where = "threads" if not config.process_actors else "processes"
    where = where if config.ray is None else "on Ray actor hosts"
    if config.inference == "central":
        how = (f"their actions from the learner's inference server, batched, up to "
               f"{server_batch(config)} envs a call (--inference central)")  # fmt: skip
        if config.server_process:
            n = config.server_processes
            which = (
                "the server in a process of its own"
                if n == 1
                else f"{n} servers, each in a process of its own with 1 actor in {n}"
            )
            how += (f", {which}, serving the weights published every "
                    f"{config.sync_every} learner update(s) (--server-process; on a CPU device "
                    f"with 1 torch thread, the rest the learner's)")  # fmt: skip
    else:
        how = (f"each with its own copy of the network (--inference local), reloaded every "
               f"{config.sync_every} learner update(s)")  # fmt: skip
    if config.env_splits > 1:
        m = config.envs_per_actor // config.env_splits
        where += f"; each steps {config.env_splits} pools of {m} envs in turn (--env-splits)"
    return f"{config.actors} actors ({where}), {how}"


@dataclasses.dataclass
class Setup:
    """What a learner module hands the loop."""

    spec: ActorSpec
    """What each actor runs."""
    learner: Learner
    channel: Channel
    total_steps: int
    """The run ends once this many env steps have come through the channel."""
    local: Callable[[int, Any], Any]
    """The actors' own policies, for `--inference local`: (actor index, `Weights` or
    `SharedWeights`) -> that actor's policy, on a copy of `actors_net(config, net)`."""
    log_every: int = 1
    """Learner updates between two logs of the stats."""
    replay: ReplayChannel | None = None
    """The channel, when it is a replay table: saved beside each checkpoint with the config's
    `save_replay`, else refilled on resume."""
    note: str | None = None
    """A line for the user at the start of the run (its log.txt keeps it)."""


def train(
    config: Any,
    resume: Path | None,
    algo: str,
    resolve: Callable[[Any], Any],
    setup: Callable[[Any, Any, Any, torch.device], Setup],
    keys: tuple[str, ...],
) -> Path:
    """Train (or, with `resume`, continue the run in that folder); return the run folder.

    `setup(config, observation space, action space, device)` builds the learner's parts; `keys`
    are those of its `state_dict`. The config is a `TorchConfig` with `ActorFields` and `actors`
    (and save_replay with a replay channel); with `ray` (a cluster address) the actors run on
    Ray actor hosts (`onebox.cluster.actor_hosts`) with their own policies (`Setup.local`)."""
    session = run.RunSession.open(config, resume, algo, resolve, keys=(*keys, "updates"))
    config, state = session.config, session.checkpoint
    ray_address = config.ray
    connected = False
    if ray_address is not None:  # before the run folder: a bad address writes nothing
        connected = cluster.connect(ray_address)
    try:
        return _train(session, config, state, algo, setup, ray_address)
    finally:
        if connected:
            cluster.disconnect(connected)


def _train(
    session: run.RunSession,
    config: Any,
    state: dict[str, Any] | None,
    algo: str,
    setup: Callable[[Any, Any, Any, torch.device], Setup],
    ray_address: str | None,
) -> Path:
    """`train`'s loop, on an opened session (and a connected cluster with `ray_address`)."""
    device = setup_torch(config)
    probe_spec = ActorSpec(env=config.env, num_envs=1, num_threads=1,
                           env_options=parse_env_options(config.env_options), unroll=1,
                           outputs={}, lstm=None)  # fmt: skip
    with probe_spec.make_pool(config.seed) as probe:
        obs_space, act_space = probe.single_observation_space, probe.single_action_space
    parts = setup(config, obs_space, act_space, device)
    learner, channel, spec = parts.learner, parts.channel, parts.spec
    updates, global_step = 0, session.step
    refilled = False
    if state is not None:
        learner.load_state_dict(state)
        updates = state["updates"]
        if parts.replay is not None:
            refilled = not offpolicy.load_replay(config, session.run_dir, parts.replay.resume_from)
    seed0 = config.seed + 10_000 * updates  # fresh env seeds on resume

    def checkpoint() -> dict[str, Any]:
        if parts.replay is not None and config.save_replay:  # first: never older than the run
            parts.replay.save(session.run_dir / offpolicy.REPLAY_FILE)
        return {**learner.state_dict(), "updates": updates}

    with session.start(checkpoint, total=parts.total_steps):
        session.logger.note(global_step, actors_note(config))
        if parts.note is not None:
            session.logger.note(global_step, parts.note)
        if refilled:
            offpolicy.note_refill(session.logger, global_step, config)
        n = spec.num_envs
        local = parts.local if config.inference == "local" else None
        weights: Weights | SharedWeights | None = None
        if local is not None or config.server_process:
            make = SharedWeights.create if config.process_actors else Weights
            weights = make(learner.net, updates)
        options = {"max_batch": server_batch(config), "timeout_ms": config.timeout_ms,
                   "device": device, "lstm": spec.lstm, "max_restarts": config.actor_restarts,
                   "outputs": learner.outputs,
                   "pad_batches": getattr(config, "compile", False)}  # fmt: skip
        server: InferenceServer | ServerProcess
        if config.server_process:
            assert isinstance(weights, SharedWeights)
            server = ServerProcess(learner.net, learner.policy, weights, obs_space, act_space,
                                   processes=config.server_processes, **options)  # fmt: skip
        else:
            server = InferenceServer(learner.policy, obs_space, act_space, **options)
        server.version = updates
        seeds = [seed0 + a * n for a in range(config.actors)]
        threads: list[ThreadActor] = []
        procs: ProcessActors | None = None
        hosts: Any = None  # onebox.cluster.actor_hosts.RayActors, with --ray
        if ray_address is None and not config.process_actors:
            for a in range(config.actors):
                infer = (
                    local(a, weights) if local is not None else functools.partial(server.infer, a)
                )
                threads.append(ThreadActor(a, spec, infer, channel, seeds[a]))

        actor_stats = ActorStats(lambda: [actor.timing.totals_so_far() for actor in threads]
                                 + (procs.timing() if procs is not None else []))  # fmt: skip

        def check() -> bool:  # while waiting for the channel: raise a failed actor's error
            for actor in threads:
                if actor.error is not None:
                    raise RuntimeError(f"{actor.name} failed") from actor.error
            if procs is not None:
                procs.check()
            if hosts is not None:
                hosts.check()
            return session.stopping

        try:
            for actor in threads:
                actor.start()
            if config.process_actors:
                shared = weights if local is not None else None
                assert shared is None or isinstance(shared, SharedWeights)
                procs = ProcessActors(config.actors, spec, server, channel, seeds, local, shared)
                if isinstance(server, ServerProcess):
                    server.start()
            server_stats = ServerStats(server)
            if ray_address is not None:
                from onebox.cluster import actor_hosts, cpu_nodes

                hosts = actor_hosts.RayActors(
                    config.actors, config.actor_hosts or cpu_nodes(), spec, local, weights,
                    channel, seeds, config.actor_restarts, config.torch_threads or 1,
                )  # fmt: skip
            while global_step < parts.total_steps and not session.stopping:
                with session.timer("wait"):
                    batch = channel.take(check)
                if batch is None:
                    break
                with session.timer("learn"):
                    stats = learner.update(batch, server)
                updates += 1
                if weights is not None and updates % config.sync_every == 0:
                    weights.publish(learner.net, server.version)
                steps, returns, lengths = channel.progress()
                global_step += steps
                session.episodes(global_step, returns, lengths)
                if updates % parts.log_every == 0:
                    stats.update({"charts/updates": updates, **session.rates(global_step)})
                    stats.update(server_stats.update())
                    stats.update(actor_stats.update())
                    if procs is not None:
                        stats["charts/actor_restarts"] = procs.restarts()
                    if hosts is not None:
                        stats["charts/actor_restarts"] = hosts.restarts()
                        stats.update(hosts.scalars())
                    session.log(global_step, stats)
                session.update(global_step)
        finally:
            if hosts is not None:
                hosts.close()
            if procs is not None:
                procs.close()
            for actor in threads:
                actor.stop.set()
            server.close()
            for actor in threads:
                actor.join()
            if procs is not None:
                procs.release()
            if isinstance(weights, SharedWeights):
                weights.close(unlink=True)
    return session.run_dir
