"""Actor hosts on Ray: the actors of IMPALA, APPO, Ape-X and R2D2 spread over a cluster's machines.

    learner node (the driver):  learner, channel (FIFO or replay), one pump thread per host
        ^ unrolls                 | versioned weights (Ray's object store, once per version)
        |                         v
    actor host h (a Ray actor process on any node): its actors (threads, each an env pool), a
        node-local copy of the policy (`Setup.local`; with several actors behind the host's own
        inference server, which batches their requests; either keeps a recurrent policy's
        state per env, `EnvStates`), a bounded queue of finished unrolls

Each pump asks its host for the unrolls finished since its last call (`ActorHost.take`), handing
it the learner's newest weights when the host's copy is older, and puts them on the channel.
No call crosses machines per env step: one per batch of unrolls. Backpressure: a pump waits while
the channel is full, the host's queue then fills, and its actors wait for room.

A host that dies (its process killed, its node gone) or stops answering is replaced by a new one,
which Ray places on a node with room, with envs seeded afresh; the learner never stops.
`charts/actor_restarts` counts the replacements; more than `--actor-restarts` per host fail the
run. An unroll is published once its host's `take` returned it: it reaches the learner whatever
happens to the host after that; those still in a dead host's queue are lost with it.

Per host, the run logs `hosts/H/env_steps_per_s`, `unrolls_sent`, `bytes_sent` and
`policy_lag` (the learner's version minus the behaviour version of the unrolls it sent).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from onebox.cluster import import_ray
from onebox.sampling.actors import ActorSpec, ThreadActor
from onebox.sampling.inference import InferenceServer
from onebox.sampling.policies import Weights
from onebox.sampling.rollout import Rollout

TAKE_WAIT_S = 1.0
"""How long a host's `take` waits for a first unroll before it answers with none."""

ANSWER_TIMEOUT_S = 120.0
"""A host that has not answered a `take` within this time (its start included) is replaced."""

LocalFn = Callable[[int, Any], Any]
"""`Setup.local`: (actor index, weights) -> that actor's policy."""


Packed = tuple[int, Rollout, np.ndarray, np.ndarray]
"""An unroll as it crosses the network: (actor, the unroll with an empty `final_obs`, the flat
(t * envs + env) indices of the steps that ended an episode, their final observations)."""


def pack(actor: int, unroll: Rollout) -> Packed:
    """Leave out the `final_obs` rows that repeat an observation the unroll holds anyway
    (obs[t + 1], or `next_obs` after the last step): only episode ends keep theirs. This halves
    what an image observation sends."""
    ends = np.flatnonzero(unroll.ends.reshape(-1))
    finals = unroll.final_obs.reshape(-1, *unroll.final_obs.shape[2:])[ends]
    empty = np.empty(0, unroll.final_obs.dtype)
    return actor, dataclasses.replace(unroll, final_obs=empty), ends, finals


def unpack(packed: Packed) -> tuple[int, Rollout]:
    """`pack`'s inverse: the actor and its unroll, `final_obs` rebuilt."""
    actor, unroll, ends, finals = packed
    final_obs = np.concatenate([unroll.obs[1:], unroll.next_obs[None]])
    final_obs.reshape(-1, *final_obs.shape[2:])[ends] = finals
    return actor, dataclasses.replace(unroll, final_obs=final_obs)


def unroll_bytes(unroll: Rollout) -> int:
    """Bytes of an unroll's arrays (what crosses the network for it)."""
    arrays = [unroll.obs, unroll.actions, unroll.rewards, unroll.terminated, unroll.truncated,
              unroll.starts, unroll.versions, unroll.final_obs, unroll.next_obs,
              *unroll.outputs.values(), *unroll.final.values(), *(unroll.state or ())]  # fmt: skip
    return sum(a.nbytes for a in arrays)


class _HostWeights:
    """The host's copy of the learner's weights, `(version, state_dict)`, as `Weights` holds them
    (the actors' local policies read `latest`)."""

    def __init__(self, version: int, state: dict[str, torch.Tensor]) -> None:
        self.latest = (version, state)


class _HostQueue:
    """The host's bounded queue of finished (actor, unroll); the actors' channel."""

    def __init__(self, capacity: int) -> None:
        self.queue: queue.Queue[tuple[int, Rollout]] = queue.Queue(maxsize=capacity)

    def put(self, actor: int, unroll: Rollout, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.queue.put((actor, unroll), timeout=0.1)
                return
            except queue.Full:
                continue


class ActorHost:
    """One actor host (run as a Ray actor): threads for `actors`, each with an env pool seeded
    `seeds[i]`, feeding a queue of one unroll per actor. One actor calls its policy
    `local(actor, weights)` directly; several share one copy of it behind a node-local
    `InferenceServer`, which merges their requests into one forward pass."""

    def __init__(self, spec: ActorSpec, local: LocalFn, actors: list[int], seeds: list[int],
                 version: int, state: dict[str, torch.Tensor], torch_threads: int) -> None:  # fmt: skip
        torch.set_num_threads(torch_threads)
        self.weights = _HostWeights(version, state)
        self.queue = _HostQueue(capacity=len(actors))
        self.server: InferenceServer | None = None
        policy = local(actors[0], self.weights)
        infers = [policy]
        if len(actors) > 1:
            policy.net.load_state_dict(state)
            with spec.make_pool(seeds[0], num_envs=1) as probe:
                spaces = (probe.single_observation_space, probe.single_action_space)
            self.server = InferenceServer(policy.policy, *spaces, len(actors) * spec.num_envs,
                                          device=policy.device, lstm=spec.lstm,
                                          outputs=spec.outputs)  # fmt: skip
            self.server.version = version
            self.net = policy.net
            infers = [functools.partial(self.server.infer, a) for a in actors]
        self.actors = [ThreadActor(a, spec, infer, self.queue, seed)
                       for a, infer, seed in zip(actors, infers, seeds, strict=True)]  # fmt: skip
        for actor in self.actors:
            actor.start()

    def take(self, version: int, state: dict[str, torch.Tensor] | None) -> list[Packed]:
        """The unrolls finished since the last call (waiting up to `TAKE_WAIT_S` for one),
        packed; `state`: the learner's weights of `version`, when newer than the host's."""
        if state is not None and self.server is None:
            self.weights.latest = (version, state)  # the actor's policy loads them
        elif state is not None and self.server is not None:
            with self.server.updating():  # which then bumps the version to `version`
                self.net.load_state_dict(state)
                self.server.version = version - 1
        for actor in self.actors:
            if actor.error is not None:
                raise RuntimeError(f"{actor.name} failed") from actor.error
        out = []
        try:
            out.append(self.queue.queue.get(timeout=TAKE_WAIT_S))
            while True:
                out.append(self.queue.queue.get_nowait())
        except queue.Empty:
            pass
        return [pack(actor, unroll) for actor, unroll in out]

    def close(self) -> None:
        """Stop the actors (and the host's inference server)."""
        for actor in self.actors:
            actor.stop.set()
        if self.server is not None:
            self.server.close()  # fails requests still waiting, so that no actor hangs
        for actor in self.actors:
            actor.join()


class _HostStats:
    """What the learner has received from one host: totals over the run, the rate over the
    latest window of at least `WINDOW_S` seconds, and the policy lag of the unrolls received
    since the last log."""

    WINDOW_S = 2.0

    def __init__(self) -> None:
        self.unrolls, self.bytes, self.steps = 0, 0, 0
        self.window_steps, self.lag_sum, self.lag_count = 0, 0.0, 0
        self.since = time.perf_counter()
        self.rate, self.lag = 0.0, float("nan")

    def add(self, packed: Packed, version: int) -> None:
        _, unroll, ends, finals = packed
        self.unrolls += 1
        self.bytes += unroll_bytes(unroll) + ends.nbytes + finals.nbytes
        self.steps += unroll.env_steps
        self.window_steps += unroll.env_steps
        self.lag_sum += float(np.mean(version - unroll.versions))
        self.lag_count += 1

    def scalars(self, h: int) -> dict[str, float]:
        """This host's metrics."""
        now = time.perf_counter()
        if now - self.since >= self.WINDOW_S:
            self.rate = self.window_steps / (now - self.since)
            self.window_steps, self.since = 0, now
        if self.lag_count:
            self.lag = self.lag_sum / self.lag_count
            self.lag_sum, self.lag_count = 0.0, 0
        out = {
            f"hosts/{h}/env_steps_per_s": self.rate,
            f"hosts/{h}/unrolls_sent": float(self.unrolls),
            f"hosts/{h}/bytes_sent": float(self.bytes),
        }
        if self.lag == self.lag:  # not NaN: some unroll came
            out[f"hosts/{h}/policy_lag"] = self.lag
        return out


class RayActors:
    """`hosts` actor hosts on the connected Ray cluster running `count` actors between them
    (actor a on host a % hosts), and the learner-side pumps that put their unrolls on `channel`
    (anything with `put(actor, unroll, stop)`). `weights` is the learner's `Weights`, published
    by the loop; `local` builds each actor's policy (`Setup.local`, shipped to the hosts)."""

    def __init__(self, count: int, hosts: int, spec: ActorSpec, local: LocalFn, weights: Weights,
                 channel: Any, seeds: list[int], max_restarts: int, torch_threads: int) -> None:  # fmt: skip
        ray = import_ray()
        if count < hosts:
            raise ValueError(f"--actors ({count}) must be at least --actor-hosts ({hosts})")
        self.ray, self.spec, self.local, self.weights = ray, spec, local, weights
        self.channel, self.seeds, self.max_restarts = channel, seeds, max_restarts
        self.torch_threads = torch_threads
        self.members = [list(range(h, count, hosts)) for h in range(hosts)]
        self.remote = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(ActorHost)
        self.lives = [0] * hosts
        self.stats = [_HostStats() for _ in range(hosts)]
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._published: tuple[int, Any] = (-1, None)  # (version, its ObjectRef)
        self.started = [0] * hosts  # the weights' version each host started with
        self.handles = [self._start(h) for h in range(hosts)]
        self._threads = [threading.Thread(target=self._pump, args=(h,), name=f"host-{h}-pump",
                                          daemon=True) for h in range(hosts)]  # fmt: skip
        for t in self._threads:
            t.start()

    def _latest(self) -> tuple[int, Any]:
        """The newest published weights: (version, ObjectRef of their CPU state dict), put into
        the object store once per version whichever host asks first."""
        version, state = self.weights.latest
        with self._lock:
            if self._published[0] != version:
                cpu = {k: v.cpu() for k, v in state.items()}
                self._published = (version, self.ray.put(cpu))
            return self._published

    def _start(self, h: int) -> Any:
        """Start host h (its envs seeded afresh for each life)."""
        version, ref = self._latest()
        self.started[h] = version
        seeds = [self.seeds[a] + 1_000_003 * self.lives[h] for a in self.members[h]]
        return self.remote.remote(self.spec, self.local, self.members[h], seeds, version, ref,
                                  self.torch_threads)  # fmt: skip

    def _answer(self, h: int, version: int, state: Any) -> list[Packed] | None:
        """Host h's answer to one `take`; None once the run stops. Raises Ray's error when the
        host died, or TimeoutError when it did not answer in time."""
        ref = self.handles[h].take.remote(version, state)
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not self._stop.is_set():
            ready, _ = self.ray.wait([ref], timeout=1.0)
            if ready:
                return self.ray.get(ref)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer within {ANSWER_TIMEOUT_S:.0f} s")
        return None

    def _pump(self, h: int) -> None:
        errors = self.ray.exceptions
        lost = (errors.RayActorError, errors.ObjectLostError, TimeoutError)
        version_there = self.started[h]
        try:
            while not self._stop.is_set():
                version, ref = self._latest()
                try:
                    got = self._answer(h, version, ref if version != version_there else None)
                except lost as e:
                    self._replace(h, e)
                    version_there = self.started[h]
                    continue
                if got is None:
                    return
                version_there = version
                for packed in got:
                    self.stats[h].add(packed, self.weights.latest[0])
                    self.channel.put(*unpack(packed), self._stop)
        except BaseException as e:  # handed to the learner, which raises it
            self.error = e

    def _replace(self, h: int, cause: BaseException) -> None:
        """Replace host h after it died or stopped answering."""
        if self.lives[h] >= self.max_restarts:
            raise RuntimeError(
                f"actor host {h} failed {self.lives[h] + 1} times (--actor-restarts "
                f"{self.max_restarts}); last: {type(cause).__name__}: {cause}"
            )
        self.ray.kill(self.handles[h], no_restart=True)
        self.lives[h] += 1
        self.handles[h] = self._start(h)

    def check(self) -> None:
        """Raise if a host failed for good or an actor raised."""
        if self.error is not None:
            raise RuntimeError("an actor host failed") from self.error

    def restarts(self) -> int:
        """Host replacements so far."""
        return sum(self.lives)

    def scalars(self) -> dict[str, float]:
        """Per-host metrics, and the bytes sent per env step over the run."""
        out: dict[str, float] = {}
        for h, s in enumerate(self.stats):
            out.update(s.scalars(h))
        steps = sum(s.steps for s in self.stats)
        if steps:
            out["charts/bytes_per_env_step"] = sum(s.bytes for s in self.stats) / steps
        return out

    def close(self) -> None:
        """Stop the pumps and the hosts (before the learner's process exits)."""
        self._stop.set()
        for t in self._threads:
            t.join()
        stops = [handle.close.remote() for handle in self.handles]
        with contextlib.suppress(Exception):  # a host that died meanwhile has nothing to stop
            self.ray.get(stops, timeout=30)
        for handle in self.handles:
            self.ray.kill(handle, no_restart=True)
