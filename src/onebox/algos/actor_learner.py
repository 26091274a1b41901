"""The actor-learner family (IMPALA, APPO, Ape-X, R2D2): actors feed a channel, a learner
consumes it.

    env pools -> actors (threads or processes) -> channel (FIFO or replay) -> learner
                   ^                  |
                   +--- inference ----+   (the central server batches every actor's requests)

`ActorLearnerTrainer` is its trainer: it runs the inference server and the thread, process or
Ray actors, and one step takes a batch from the channel and makes one update. A learner module
subclasses it, naming its learner as `make_learner`; besides the `Learner` contract the learner
has:

- `net` (the network the actors' policy runs, whose weights are published to actors that act
  on their own copies) and `policy`, what the inference server serves (an
  `onebox.sampling.inference.PolicyFn`: named outputs), with `outputs` (what actors record
  besides actions) and `state_size` (an LSTM's, whose state the server keeps per env, or None);
- `local_policy()`: `(net, generator) -> PolicyFn`, the same policy on an actor's own copy of
  `net` with its own random stream (`--inference local`, Ray actor hosts); picklable and free of
  the learner (it travels to actor processes and hosts);
- `make_channel(obs_space, act_space)`: what feeds it (`onebox.sampling.channels`: a FIFO of
  unrolls, a replay table, a sequence table), and `steps_per_update` (a FIFO's fixed batch of
  env steps, the run then ending on a whole update; None for a replay table).

The run ends once `total_steps` env steps have reached the learner through the channel. The
trainer times the policy lag (`charts/policy_lag`: the learner's weights' version minus the
version that chose each action of the batch) and publishes the weights every `--sync-every`
updates; the learner changes its weights inside `updating` (the server's: inference waits and
the version moves on).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from onebox import cluster
from onebox.algos.common import parse_env_options, setup_torch
from onebox.algos.trainer import EnvSeeds, Step, Trainer
from onebox.sampling.actors import ACTOR_SECTIONS, ActorSpec, ProcessActors, ThreadActor
from onebox.sampling.inference import CALL_SECTIONS, InferenceServer
from onebox.sampling.policies import LocalPolicy, SharedWeights, Weights
from onebox.sampling.rollout import Rollout
from onebox.sampling.server_process import ServerProcess


@dataclasses.dataclass
class ActorFields:
    """The config fields of the actors and the inference server, shared by every learner on
    this loop (IMPALA, APPO, Ape-X, R2D2)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"ray", "actor_hosts"})

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


def actor_spec(config: Any, outputs: Any, state_size: int | None, num_envs: int | None = None
               ) -> ActorSpec:  # fmt: skip
    """What each actor runs: its envs (`envs_per_actor`, or `num_envs`), its unroll length and
    the policy's outputs it records (with an LSTM's `state_size`, its start states too)."""
    return ActorSpec(env=config.env, num_envs=num_envs or config.envs_per_actor,
                     num_threads=config.num_threads,
                     env_options=parse_env_options(config.env_options), unroll=config.unroll,
                     outputs=outputs, lstm=state_size, splits=config.env_splits)  # fmt: skip


def actor_policies(config: Any, learner: Any) -> Callable[[int, Any], LocalPolicy]:
    """`(actor, weights) -> LocalPolicy`: each actor's own policy (`--inference local`, Ray
    actor hosts), on a copy of `actors_net(config, learner.net)` with a random stream of its own
    (seeded from the run's seed and the actor), reloaded from `weights`. Picklable: it goes to
    actor processes and hosts without the learner."""
    return functools.partial(_own_policy, actors_net(config, learner.net), learner.local_policy(),
                             config.seed, learner.state_size)  # fmt: skip


def _own_policy(net: torch.nn.Module, make: Callable[[Any, torch.Generator], Any], seed: int,
                lstm: int | None, actor: int, weights: Any) -> LocalPolicy:  # fmt: skip
    copy_ = copy.deepcopy(net).requires_grad_(False)
    generator = torch.Generator(next(copy_.parameters()).device).manual_seed(seed + 7919 * actor)
    return LocalPolicy(weights, copy_, actor, policy=make(copy_, generator), lstm=lstm)


def policy_lag(version: int, unrolls: list[Rollout]) -> dict[str, float]:
    """`charts/policy_lag` (mean) and `_max` of a batch of unrolls: the learner's weights'
    `version` minus the version that chose each action."""
    lag = version - np.concatenate([u.versions for u in unrolls], 1)
    return {"charts/policy_lag": float(lag.mean()), "charts/policy_lag_max": float(lag.max())}


class ActorLearnerTrainer(Trainer):
    """Actors, inference and a channel feeding a learner (see the module's docstring)."""

    make_learner: ClassVar[Callable[..., Any]]
    """(config, observation space, action space, device) -> the learner."""

    def __init__(self, config: Any, seeds: EnvSeeds) -> None:
        super().__init__()
        self.config = config
        self.threads: list[ThreadActor] = []
        self.procs: ProcessActors | None = None
        self.hosts: Any = None  # onebox.cluster.actor_hosts.RayActors, with --ray
        self.server: InferenceServer | ServerProcess | None = None
        self.weights: Weights | SharedWeights | None = None
        # a bad address raises here, before the run folder exists
        self.connected = cluster.connect(config.ray) if config.ray is not None else False
        try:
            self.device = setup_torch(config)
            with actor_spec(config, {}, None, num_envs=1).make_pool(config.seed) as probe:
                self.spaces = (probe.single_observation_space, probe.single_action_space)
            learner = self.learner = self.make_learner(config, *self.spaces, self.device)
            self.channel = learner.make_channel(*self.spaces)
            self.replay = self.channel if learner.steps_per_update is None else None
            self.spec = actor_spec(config, learner.outputs, learner.state_size)
        except BaseException:
            self.close()
            raise
        per = learner.steps_per_update
        self.total_steps = (
            config.total_steps if per is None else max(1, config.total_steps // per) * per
        )
        n = config.envs_per_actor
        self.num_envs = config.actors * n
        first = seeds.take(config.actors * n)
        self.seeds = [first + a * n for a in range(config.actors)]

    def notes(self) -> list[str]:
        return [actors_note(self.config), *self.learner.notes()]

    def refill(self) -> str:
        return (f"it refills for {self.config.learning_starts} {self.channel.buffer.items} "
                "before learning resumes")  # fmt: skip

    def start(self) -> None:
        config, learner, spec = self.config, self.learner, self.spec
        obs_space, act_space = self.spaces
        local = config.inference == "local"
        own = actor_policies(config, learner)
        if local or config.server_process:
            make = SharedWeights.create if config.process_actors else Weights
            self.weights = make(learner.net, self.updates)
        options = {"max_batch": server_batch(config), "timeout_ms": config.timeout_ms,
                   "device": self.device, "lstm": spec.lstm,
                   "max_restarts": config.actor_restarts, "outputs": learner.outputs,
                   "pad_batches": learner.accel is not None and learner.accel.compile}  # fmt: skip
        if config.server_process:
            assert isinstance(self.weights, SharedWeights)
            self.server = ServerProcess(learner.net, learner.policy, self.weights, obs_space,
                                        act_space, processes=config.server_processes,
                                        **options)  # fmt: skip
        else:
            self.server = InferenceServer(learner.policy, obs_space, act_space, **options)
        server = self.server
        server.version = self.updates
        learner.updating = server.updating
        if config.ray is None and not config.process_actors:
            for a in range(config.actors):
                infer = own(a, self.weights) if local else functools.partial(server.infer, a)
                self.threads.append(ThreadActor(a, spec, infer, self.channel, self.seeds[a]))
        self.actor_stats = ActorStats(
            lambda: (
                [actor.timing.totals_so_far() for actor in self.threads]
                + (self.procs.timing() if self.procs is not None else [])
            )
        )
        for actor in self.threads:
            actor.start()
        if config.process_actors:
            shared = self.weights if local else None
            assert shared is None or isinstance(shared, SharedWeights)
            self.procs = ProcessActors(config.actors, spec, server, self.channel, self.seeds,
                                       own if local else None, shared)  # fmt: skip
            if isinstance(server, ServerProcess):
                server.start()
        self.server_stats = ServerStats(server)
        if config.ray is not None:
            from onebox.cluster import actor_hosts, cpu_nodes

            self.hosts = actor_hosts.RayActors(
                config.actors, config.actor_hosts or cpu_nodes(), spec, own,
                self.weights, self.channel, self.seeds, config.actor_restarts,
                config.torch_threads,
            )  # fmt: skip

    def _check(self) -> bool:
        """While waiting for the channel: raise a failed actor's error; True to stop waiting
        (the run was asked to stop)."""
        for actor in self.threads:
            if actor.error is not None:
                raise RuntimeError(f"{actor.name} failed") from actor.error
        if self.procs is not None:
            self.procs.check()
        if self.hosts is not None:
            self.hosts.check()
        return self.interrupted()

    def step(self) -> Step:
        assert self.server is not None
        with self.timer("wait"):
            batch = self.channel.take(self._check)
        if batch is None:  # stopped while waiting
            return Step({}, [], [])
        lag = policy_lag(self.server.version, batch) if isinstance(batch, list) else {}
        with self.timer("learn"), self.learner.autocast():
            stats = self.learner.update(batch)
        self.updates += 1
        if self.weights is not None and self.updates % self.config.sync_every == 0:
            self.weights.publish(self.learner.net, self.server.version)
        steps, returns, lengths = self.channel.progress()
        self.global_step += steps
        return Step({**stats, **lag}, returns, lengths)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a state, also into a running trainer (a population's member copying another):
        the weights change inside `updating` (central inference waits) and are published to
        the actors' own copies (local inference)."""
        with self.learner.updating():
            super().load_state_dict(state)
        if self.weights is not None and self.server is not None:
            self.weights.publish(self.learner.net, self.server.version)

    def charts(self) -> dict[str, float]:
        charts = {**self.server_stats.update(), **self.actor_stats.update()}
        if self.procs is not None:
            charts["charts/actor_restarts"] = self.procs.restarts()
        if self.hosts is not None:
            charts["charts/actor_restarts"] = self.hosts.restarts()
            charts.update(self.hosts.scalars())
        return charts

    def close(self) -> None:
        """Stop the Ray hosts, process actors, the server and the thread actors (in that
        order), free the shared memory and leave the cluster; idempotent."""
        hosts, procs, threads, server = self.hosts, self.procs, self.threads, self.server
        self.hosts, self.procs, self.threads, self.server = None, None, [], None
        try:
            if hosts is not None:
                hosts.close()
            if procs is not None:
                procs.close()
            for actor in threads:
                actor.stop.set()
            if server is not None:
                server.close()
            for actor in threads:
                actor.join()
            if procs is not None:
                procs.release()
            if isinstance(self.weights, SharedWeights):
                self.weights.close(unlink=True)
            self.weights = None
        finally:
            if self.connected:
                cluster.disconnect(self.connected)
                self.connected = False
