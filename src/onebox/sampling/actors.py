"""Actors of the actor-learner loop (`onebox.algos.actor_learner`): they step env pools and cut
the stream into unrolls (`onebox.sampling.Rollout`s of numpy arrays), which they hand to a
channel (a FIFO for IMPALA/APPO, a replay table for Ape-X: the actor code is the same).

An actor owns an env pool, or `ActorSpec.splits` pools that share its envs between them. Each
step it asks for actions (from the `InferenceServer`, or from its own copy of the network synced
from the learner) and records observations, actions, the policy's other named outputs
(log-probabilities and values, or Q-values), rewards, `terminated` and `truncated` apart, the
observation each step led to (the final one where an episode ended) and the weights' version
that chose each action. Where an episode was truncated it also asks the
policy about the final observation (as for an action, so a recurrent policy sees it from the
episode's own state) and records those outputs as `final`: the learner's bootstrap input. The
actor bootstraps nothing: each learner does that once, in its own transform. With an LSTM, the
unroll records the state each env started it from and `starts`, the flags of observations that
begin an episode.

With one pool an actor's envs all step, then all wait for their actions. Split (`splits` > 1,
Sample Factory's double-buffered sampling) the pools take turns: while one waits for its actions
the others step, so stepping and inference overlap inside one actor. Every env still takes one
step per unroll row, with the seed it would have in one pool, and the unrolls are the same arrays.

Two kinds:

- `ThreadActor`: a thread of the learner's process; unrolls go to the channel.
- process actors (`ProcessActors`): each a process started by the inference server's supervisor
  (and restarted by it if it dies), talking to the server through its shared-memory slot, or
  running its own copy of the network on the CPU, reloaded from `SharedWeights` (Ape-X's actors).
  Unrolls go through a ring of slots in shared memory; a collector thread in the learner copies
  out the full ones and puts them on the channel. A slot is published only once complete, so an
  actor killed mid-unroll loses only that unroll, and an unroll it published before dying still
  reaches the learner.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from multiprocessing import resource_tracker
from time import perf_counter
from typing import Any

import cloudpickle
import numpy as np
import torch

import onebox.envs
from onebox.envs.shm import Block, Layout
from onebox.nn.accel import inherit_torch_threads
from onebox.run.timing import TimeSplit
from onebox.sampling.actor_client import ActorClient, InferResult, OutputSpec
from onebox.sampling.inference import InferenceServer
from onebox.sampling.policies import SharedWeights
from onebox.sampling.rollout import Rollout
from onebox.sampling.sampler import EpisodeTracker
from onebox.sampling.server_process import ServerProcess

InferFn = Callable[[np.ndarray, np.ndarray, np.ndarray], InferResult]
"""(env ids, observations, starts) -> the actions of those envs; `starts[i]`: obs i begins an
episode (a recurrent policy's state for that env is zeroed first)."""

ACTOR_SECTIONS = ("env", "inference", "blocked")
"""What `collect` times: the env pools, waiting for actions, waiting for the learner."""


@dataclasses.dataclass(frozen=True)
class ActorSpec:
    """What an actor needs to know: its envs and how to cut unrolls."""

    env: str
    """Env id."""
    num_envs: int
    """Envs in the actor's pool."""
    num_threads: int
    """Pool threads."""
    env_options: dict[str, Any]
    """The env's constructor options."""
    unroll: int
    """Steps per unroll."""
    outputs: OutputSpec
    """The policy's outputs besides actions, recorded at every step (and at final observations
    of truncated episodes)."""
    lstm: int | None
    """LSTM size of a recurrent policy (its unrolls record the start state), or None."""
    splits: int = 1
    """Pools the actor's envs are split into, stepped in turn (see the module docstring); each
    has `num_threads` threads (at most its envs)."""

    def make_pools(self, seed: int) -> list[Any]:
        """The actor's `splits` pools, env i of the actor seeded `seed + i` as in one pool."""
        return onebox.envs.make_splits(self.splits, self.env, self.num_envs, self.num_threads,
                                       seed, autoreset_mode="SameStep",
                                       **self.env_options)  # fmt: skip

    def make_pool(self, seed: int, num_envs: int | None = None) -> Any:
        """One pool of the actor's env (same-step autoreset: final observations of truncated
        episodes), of `num_envs` envs (default the actor's): what a learner probes."""
        return onebox.envs.make(
            self.env,
            num_envs or self.num_envs,
            num_threads=self.num_threads,
            seed=seed,
            autoreset_mode="SameStep",
            **self.env_options,
        )

    def arrays(self, obs_shape: tuple[int, ...], obs_dtype: Any) -> list[tuple[str, tuple, Any]]:
        """(name, shape, dtype) of one unroll's arrays."""
        t, n = self.unroll, self.num_envs
        out = [
            ("obs", (t, n, *obs_shape), obs_dtype),
            ("actions", (t, n), np.int64),
            ("rewards", (t, n), np.float32),
            ("terminated", (t, n), np.bool_),
            ("truncated", (t, n), np.bool_),
            ("starts", (t, n), np.bool_),
            ("versions", (t, n), np.int64),
            ("final_obs", (t, n, *obs_shape), obs_dtype),
            ("next_obs", (n, *obs_shape), obs_dtype),
        ]
        for k, (shape, dtype) in self.outputs.items():
            out += [(f"out.{k}", (t, n, *shape), dtype), (f"final.{k}", (t, n, *shape), dtype)]
        if self.lstm is not None:
            out += [("h", (n, self.lstm), np.float32), ("c", (n, self.lstm), np.float32)]
        return out


def collect(
    spec: ActorSpec,
    infer: InferFn,
    pools: list[Any],
    seed: int,
    buffers: Callable[[], dict[str, np.ndarray] | None],
    publish: Callable[[list[float], list[int]], None],
    timing: TimeSplit | None = None,
) -> None:
    """The actor loop: fill the arrays `buffers()` gives (None: stop) with one unroll, then
    `publish(returns, lengths)` it; repeat. `pools` (from `spec.make_pools`) hold envs
    [0, m), [m, 2m), ... of the actor; each row, a pool's results for the row before are
    taken while the next pool's step is in flight, then its next step is sent. `timing`, if
    given, adds up the loop's seconds in the env pools ("env"), waiting for actions
    ("inference") and waiting for `buffers` and `publish` ("blocked": the learner's side)."""
    timer = timing if timing is not None else TimeSplit()
    t_len, m = spec.unroll, pools[0].num_envs
    ids = [np.arange(k * m, (k + 1) * m) for k in range(len(pools))]
    cols = [slice(k * m, (k + 1) * m) for k in range(len(pools))]
    tracker = EpisodeTracker(m * len(pools))
    obs = [np.empty(0)] * len(pools)
    starts = np.ones(m * len(pools), np.bool_)
    for k, pool in enumerate(pools):
        pool.async_reset(seed=seed + k * m)
    for k, pool in enumerate(pools):
        first, *_, info = pool.recv()
        obs[k] = _in_env_order(first, info["env_id"])

    def act(buf: dict[str, np.ndarray], k: int, t: int) -> None:
        c = cols[k]
        with timer("inference"):
            result = infer(ids[k], obs[k], starts[c])
        if t == 0 and result.state is not None:
            buf["h"][c], buf["c"][c] = result.state
        buf["obs"][t, c], buf["starts"][t, c] = obs[k], starts[c]
        buf["actions"][t, c], buf["versions"][t, c] = result.actions, result.version
        for key in spec.outputs:
            buf[f"out.{key}"][t, c] = result.outputs[key]
            buf[f"final.{key}"][t, c] = 0
        with timer("env"):
            pools[k].send(result.actions)

    def finish(buf: dict[str, np.ndarray], k: int, t: int) -> None:
        with timer("env"):
            o, reward, term, trunc, info = pools[k].recv()
        env = k * m + np.asarray(info["env_id"], np.int64)  # the actor's envs, in batch order
        ends = np.logical_or(term, trunc)
        starts[env] = ends
        tracker.update(env, reward, ends, info)
        buf["rewards"][t, env], buf["terminated"][t, env] = reward, term
        buf["truncated"][t, env], buf["final_obs"][t, env] = trunc, o
        for i in np.flatnonzero(ends):
            buf["final_obs"][t, env[i]] = info["final_obs"][i]
        obs[k] = _in_env_order(o, env - k * m)
        cut = env[np.logical_and(trunc, np.logical_not(term))]
        if len(cut):  # the bootstrap input, from the episodes' own states
            with timer("inference"):
                final = infer(cut, buf["final_obs"][t, cut], np.zeros(len(cut), np.bool_))
            for key in spec.outputs:
                buf[f"final.{key}"][t, cut] = final.outputs[key]

    def next_buffers() -> dict[str, np.ndarray] | None:
        with timer("blocked"):
            return buffers()

    while (buf := next_buffers()) is not None:
        for t in range(t_len):
            for k in range(len(pools)):
                if t:
                    finish(buf, k, t - 1)
                act(buf, k, t)
        for k in range(len(pools)):
            finish(buf, k, t_len - 1)
        buf["next_obs"][:] = np.concatenate(obs)
        with timer("blocked"):
            publish(*tracker.pop())


def _in_env_order(batch: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
    """A whole pool's results `batch`, row i of env `env_ids[i]`, as rows in env order."""
    if np.array_equal(env_ids, np.arange(len(env_ids))):
        return batch
    out = np.empty_like(batch)
    out[env_ids] = batch
    return out


class ThreadActor(threading.Thread):
    """An actor thread: steps its pool with actions from `infer` and puts unrolls on `channel`
    (anything with `put(actor, unroll, stop)`)."""

    def __init__(self, index: int, spec: ActorSpec, infer: InferFn, channel: Any, seed: int):
        super().__init__(name=f"actor-{index}", daemon=True)
        self.index, self.spec, self.infer, self.channel, self.seed = (
            index,
            spec,
            infer,
            channel,
            seed,
        )
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.pools = spec.make_pools(seed)
        space = self.pools[0].single_observation_space
        self._arrays: list[tuple[str, tuple, Any]] = spec.arrays(space.shape, space.dtype)
        self._buf: dict[str, np.ndarray] = {}
        self.timing = TimeSplit()
        """The actor's seconds in its env pools, waiting for actions and waiting for the learner
        (see `collect`), since it started."""

    def run(self) -> None:
        inherit_torch_threads()  # a local policy runs here
        try:
            collect(self.spec, self.infer, self.pools, self.seed, self._buffers, self._publish,
                    self.timing)  # fmt: skip
        except BaseException as e:  # handed to the learner, which raises it
            self.error = e
        finally:
            for pool in self.pools:
                pool.close()

    def _buffers(self) -> dict[str, np.ndarray] | None:
        if self.stop.is_set():
            return None
        self._buf = {name: np.empty(shape, dtype) for name, shape, dtype in self._arrays}
        return self._buf

    def _publish(self, returns: list[float], lengths: list[int]) -> None:
        self.channel.put(self.index, Rollout.from_arrays(self._buf, returns, lengths), self.stop)


# ---- process actors -----------------------------------------------------------------------------

_FREE, _FULL = 0, 1

ACTOR_NICENESS = 10
"""How much lower a process actor's scheduling priority is than the learner's (`os.nice`). Every
actor waits on the learner (its inference server, its rate limit, its weights), so where cores are
short the learner should win them: on 2 cores, 4 Ape-X actors at the same priority kept the
learner's thread waiting for a core 16% of the time (`/proc/PID/task/TID/schedstat`). Where a core
is idle the actors use it whatever their priority."""


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (a signal 0 reaches it, or exists but is not ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class UnrollRing:
    """A process actor's `slots` unroll slots in one shared-memory block, plus its episode
    statistics, the slots' states (free/full) and order, its life count, a stop flag, the
    learner's process id and the actor's time this life (`SharedTiming`).

    Two semaphores wake the sides up instead of polling (a poll beside the learner costs it a
    hand-off of the GIL or of its core each time): `arrived` is released at each publish (the
    learner's collector waits on it, for every ring at once), `freed` at each slot the learner
    frees (the actor waits on it). They are hints; the flags say which slots are full."""

    def __init__(self, layout: Layout, arrived: Any, freed: Any, name: str | None = None) -> None:
        self.block = Block(layout, name=name)
        self.a = self.block.arrays
        self.slots = len(self.a["flags"])
        self.arrived, self.freed = arrived, freed
        if name is None:  # the learner's side makes the block
            self.a["owner"][0] = os.getpid()

    @classmethod
    def plan(
        cls, spec: ActorSpec, obs_shape: tuple[int, ...], obs_dtype: Any, slots: int = 2
    ) -> Layout:
        """The layout of a ring for `spec`'s unrolls."""
        cap = spec.unroll * spec.num_envs  # at most one episode ends per env step
        arrays = [
            (name, (slots, *shape), dtype)
            for name, shape, dtype in spec.arrays(obs_shape, obs_dtype)
        ]
        arrays += [
            ("ep_returns", (slots, cap), np.float64),
            ("ep_lengths", (slots, cap), np.int64),
            ("ep_count", (slots,), np.int64),
            ("flags", (slots,), np.int64),
            ("order", (slots,), np.int64),
            ("lives", (1,), np.int64),
            ("stop", (1,), np.int64),
            ("owner", (1,), np.int64),
            ("timing", (SharedTiming.SIZE,), np.float64),
        ]
        return Layout.plan(arrays)

    def slot(self, k: int) -> dict[str, np.ndarray]:
        """Views of slot k's unroll arrays."""
        skip = {"ep_returns", "ep_lengths", "ep_count", "flags", "order", "lives", "stop",
                "owner", "timing"}  # fmt: skip
        return {name: v[k] for name, v in self.a.items() if name not in skip}

    # the actor's side

    def acquire(self) -> int | None:
        """A free slot to write (waiting for the learner to free one), or None once stopped, or
        once the learner's process is gone (killed, it can neither free a slot nor say stop:
        its actors would wait here for good)."""
        while not self.a["stop"][0]:
            free = np.flatnonzero(self.a["flags"] == _FREE)
            if len(free):
                return int(free[0])
            if not self.freed.acquire(timeout=0.05) and not _alive(int(self.a["owner"][0])):
                return None
        return None

    def publish(self, k: int, returns: list[float], lengths: list[int]) -> None:
        """Slot k is complete: record its episodes and hand it to the learner."""
        m = len(returns)
        self.a["ep_returns"][k, :m], self.a["ep_lengths"][k, :m] = returns, lengths
        self.a["ep_count"][k] = m
        self.a["order"][k] = self.a["order"].max() + 1
        self.a["flags"][k] = _FULL  # last: the learner reads the slot only after this store
        self.arrived.release()

    # the learner's side

    def take(self) -> list[Rollout]:
        """Copies of the full slots, oldest first; their slots are freed."""
        full = np.flatnonzero(self.a["flags"] == _FULL)
        out = []
        for k in full[np.argsort(self.a["order"][full])]:
            m = int(self.a["ep_count"][k])
            arrays = {name: v.copy() for name, v in self.slot(int(k)).items()}
            returns = self.a["ep_returns"][k, :m].tolist()
            lengths = self.a["ep_lengths"][k, :m].tolist()
            out.append(Rollout.from_arrays(arrays, returns, lengths))
            self.a["flags"][k] = _FREE
            self.freed.release()
        return out


def process_actor(client: ActorClient, spec: ActorSpec, ring_name: str, layout: Layout,
                  wakes: tuple[Any, Any], seed: int, actor: int, local: bytes | None,
                  weights: tuple[Layout, str] | None) -> None:  # fmt: skip
    """A process actor's body: its pool, inference through `client` (or, with `local`, the
    cloudpickled `Setup.local`, its own copy of the network on 1 torch thread, reloaded from the
    `SharedWeights` at `weights`), unrolls into its ring (`wakes`: its `arrived` and `freed`).

    A restarted actor's envs start from new seeds (the ring counts its lives). It runs at a lower
    priority than the learner (`ACTOR_NICENESS`)."""
    os.nice(ACTOR_NICENESS)
    ring = UnrollRing(layout, *wakes, name=ring_name)
    shared = SharedWeights(*weights) if weights is not None else None
    try:
        ring.a["lives"][0] += 1
        seed += 1_000_003 * int(ring.a["lives"][0] - 1)
        slot = [-1]

        def buffers() -> dict[str, np.ndarray] | None:
            k = ring.acquire()
            if k is None:
                return None
            slot[0] = k
            return ring.slot(k)

        def central(ids: np.ndarray, obs: np.ndarray, starts: np.ndarray) -> InferResult:
            return client.infer(obs, ids, starts)

        infer: InferFn = central
        if local is not None:
            assert shared is not None, "ProcessActors hands a local policy its weights"
            torch.set_num_threads(1)  # the cores are the pools' and the learner's
            infer = cloudpickle.loads(local)(actor, shared)
        pools = spec.make_pools(seed)

        def publish(returns: list[float], lengths: list[int]) -> None:
            ring.publish(slot[0], returns, lengths)

        try:
            collect(spec, infer, pools, seed, buffers, publish, SharedTiming(ring.a["timing"]))
        finally:
            for pool in pools:
                pool.close()
    finally:
        ring.block.close()
        if shared is not None:
            shared.close()


class SharedTiming(TimeSplit):
    """A process actor's `TimeSplit`, kept in `array` (its ring's shared `timing`) as it goes so
    that the learner reads the actor's time as it is spent (`read`): the total of each of
    `ACTOR_SECTIONS` as it ends, then the open one's index (-1: none) and start
    (`perf_counter`, one clock for every process of the machine)."""

    __slots__ = ("_array",)

    SIZE = len(ACTOR_SECTIONS) + 2
    """Floats in `array`."""

    def __init__(self, array: np.ndarray) -> None:
        super().__init__()
        self._array = array
        array[:] = 0.0
        array[-2] = -1

    def __enter__(self) -> None:
        super().__enter__()
        name, start, _ = self._stack[-1]
        if name in ACTOR_SECTIONS:
            self._array[-1] = start
            self._array[-2] = ACTOR_SECTIONS.index(name)

    def __exit__(self, *exc: object) -> None:
        name = self._stack[-1][0]
        super().__exit__(*exc)
        if name in ACTOR_SECTIONS:
            self._array[-2] = -1  # first: a read in between misses the section, never doubles it
            self._array[ACTOR_SECTIONS.index(name)] = self._totals[name]

    @staticmethod
    def read(array: np.ndarray) -> dict[str, float]:
        """The seconds so far per section of the actor writing `array` (see `totals_so_far`)."""
        values = array.tolist()
        out = dict(zip(ACTOR_SECTIONS, values, strict=False))
        if values[-2] >= 0:
            name = ACTOR_SECTIONS[int(values[-2])]
            out[name] += max(0.0, perf_counter() - values[-1])
        return out


class ProcessActors:
    """`count` process actors on `server`, and the learner-side thread collecting their unrolls
    onto `channel` (anything with `put(actor, unroll, stop)`). With `local` (`Setup.local`,
    whose network is on the CPU) and `weights`, each actor runs its own policy, reloaded from
    `weights` whenever the learner publishes; else each asks `server`."""

    def __init__(
        self,
        count: int,
        spec: ActorSpec,
        server: InferenceServer | ServerProcess,
        channel: Any,
        seeds: list[int],
        local: Callable[[int, Any], Any] | None = None,
        weights: SharedWeights | None = None,
    ) -> None:
        if (local is None) != (weights is None):
            raise ValueError("process actors with their own policies need both local and weights")
        self.server, self.channel, self.count = server, channel, count
        space = server.obs_space
        resource_tracker.ensure_running()  # shared with the children: the parent's unlink counts
        layout = UnrollRing.plan(spec, space.shape, space.dtype)
        self.arrived = server.context.Semaphore(0)
        self.rings = [UnrollRing(layout, self.arrived, server.context.Semaphore(0))
                      for _ in range(count)]  # fmt: skip
        policy = cloudpickle.dumps(local) if local is not None else None
        at = (weights.block.layout, weights.block.name) if weights is not None else None
        for a, ring in enumerate(self.rings):
            wakes = (ring.arrived, ring.freed)
            server.spawn(a, process_actor, spec.num_envs,
                         (spec, ring.block.name, layout, wakes, seeds[a], a, policy, at))  # fmt: skip
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._collect, name="unroll-collector", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise if an actor died for good (after its restarts) or the collector failed."""
        if self.error is not None:
            raise RuntimeError("collecting unrolls failed") from self.error
        for a in range(self.count):
            failure = self.server.failure(a)
            if failure is not None:
                raise RuntimeError(failure)

    def restarts(self) -> int:
        """Restarts of all actors so far."""
        return sum(self.server.restarts(a) for a in range(self.count))

    def timing(self) -> list[dict[str, float]]:
        """Each actor's seconds in each of `ACTOR_SECTIONS` in its current life so far."""
        return [SharedTiming.read(ring.a["timing"]) for ring in self.rings]

    def _collect(self) -> None:
        try:
            while not self._stop.is_set():
                got = [(a, u) for a, ring in enumerate(self.rings) for u in ring.take()]
                for actor, unroll in got:
                    self.channel.put(actor, unroll, self._stop)
                if not got:
                    self.arrived.acquire(timeout=0.05)
        except BaseException as e:
            self.error = e

    def close(self) -> None:
        """Stop the actors (before the server closes) and the collector; free the rings."""
        for ring in self.rings:
            ring.a["stop"][0] = 1
        self._stop.set()
        self._thread.join()

    def release(self) -> None:
        """Free the rings' shared memory (after the server has stopped the processes)."""
        for ring in self.rings:
            ring.a = {}
            ring.block.close(unlink=True)
