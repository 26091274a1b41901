"""Continuous batching of a population's episodes: K network slots over the async env engine.

How it runs:
- The K slots are split into groups (two by default, `slot_groups`), each with its own env pool.
  While one group's networks run, the other groups' envs step on the engine's threads, so
  simulation and inference overlap.
- Each slot plays one episode of one individual. Each step only the running slots' networks are
  computed: running slots are kept a prefix of the group's slots, so the networks read the stacked
  parameters in place. When an episode ends its slot is refilled at once with the next
  (individual, episode) pair from the queue (the individual's parameters, made ahead on a helper
  thread by `onebox.evo.prefetch`, are copied into the slot);
  with the queue empty, the last running slot moves into the hole.
- Determinism: pair j (individual-major order) always plays in an env reset with seed
  `seed + j`, whatever K, the thread count or the timing (`pair_seeds`; without it, Atari only,
  see below).

The envs are driven in one of two ways, by backend:
- Rounds (the native engine and the process backend, whose envs may wait received-but-unsent
  while others run). These cannot reseed one env while others run, so each group's pool holds one
  env per queued pair, with `batch_size` the group's slot count: a round resets the pool with the
  pairs' seeds (`async_reset(seeds)`), collects every first observation, then plays the pairs
  through the group's slots. A group with more pairs than envs (`max_envs`) plays several rounds.
  Envs with no pair left keep a group's batch full near the end of a round: they are stepped with
  a zero action and their results are ignored (the engine's `recv` always returns `batch_size`).
- Resets (Atari: ALE's engine steps only the envs of the last `recv`, all of them, so no env can
  wait unsent). Each group's pool is synchronous with one env per slot, and every step sends all
  its envs: the running ones their networks' actions, the idle ones (no pair left) a no-op whose
  results are ignored. A pair starts in a free env with a seeded reset of that env alone
  (`AtariEnvPool.reset_envs`), for which ALE reloads the ROM (about 0.1 s of
  CPU per episode: the price of fitnesses that do not depend on K). A reset blocks its group's
  pool, so each group runs in its own thread (ALE and torch release the GIL) and one group's
  resets overlap the other's steps and inference; on CUDA each group's GPU work goes on a
  stream of its own (`SlotGroup.own_stream`). With `turns` the groups' pools step one at a
  time: a group waits for its turn before sending its step and hands the turn on once the step
  is back, so the pool in flight has every engine core while the other groups run their
  networks. (Pools left to share the cores keep the offset they were sent at: one sent d ms
  after another finishes about d ms after it, and where the networks and the loop take longer
  than d, both wait unsent at once: with two groups no pool was in flight 19% of the time on a
  16-core GPU machine.) Without `pair_seeds` (`episode_seeds="env"`)
  each `play` resets a group's whole pool once, env e with the seed of the group's e-th pair (so
  each group's first pairs play as with pair seeds), and no reset is called after that: an env
  whose episode ended is sent a no-op at the next step, which is ALE's own unseeded reset of it
  (the engine's autoreset, on its worker threads beside the other envs' steps, no reload), and
  the reset's observation starts the env's next pair; its slot waits that one step. The env's
  random stream (no-op starts, sticky actions) and, in some games, its emulator state go on from
  its earlier episodes: the fitnesses then depend on K, not on the thread count or the timing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

import numpy as np
import torch

from onebox.evo.prefetch import Prefetch
from onebox.nn.accel import Staging, inherit_torch_threads
from onebox.nn.population import PopulationNet
from onebox.run import InFlight, TimeSplit


@contextlib.contextmanager
def _rest_as_other(into: SlotGroup, groups: list[SlotGroup]) -> Iterator[None]:
    """Add to `into`'s split, as "other", the block's wall time that none of `groups`' sections
    timed (the groups played in this thread)."""

    def timed() -> float:
        return sum(sum(g.timing.totals().values()) for g in groups)

    t0, before = perf_counter(), timed()
    try:
        yield
    finally:
        into.timing.add("other", perf_counter() - t0 - (timed() - before))


class SlotGroup:
    """One slot group: a contiguous range of network slots and the engine pool behind them."""

    def __init__(
        self, pool: Any, lo: int, size: int, obs_shape: tuple[int, ...], device: torch.device
    ) -> None:
        self.pool, self.lo, self.size = pool, lo, size
        self.num_envs = pool.num_envs
        dtype = pool.single_observation_space.dtype
        self.staging = Staging(device)  # on CUDA: pinned buffers, non-blocking copies
        self.obs = self.staging.host_array((size, *obs_shape), dtype)  # sent as it is
        self.first_obs = np.zeros((self.num_envs, *obs_shape), dtype=dtype)
        self.resetting = np.zeros(self.num_envs, dtype=bool)  # env seeds: ended, reset next step
        self.slot_pair = np.full(size, -1, dtype=np.int64)
        self.slot_env = np.full(size, -1, dtype=np.int64)
        self.env_slot = np.full(self.num_envs, -1, dtype=np.int64)
        self.ret = np.zeros(size, dtype=np.float64)
        self.len = np.zeros(size, dtype=np.int64)
        self.pairs = np.zeros(0, dtype=np.int64)  # this group's pairs, in order
        self.round_start = 0  # index in `pairs` of the current round's first pair
        self.next = 0  # index in `pairs` of the next pair to start
        self.running = 0  # slots [0, running) play episodes; the rest are free
        self.idle: list[int] = []  # resets: envs without a pair, for the next pairs (env seeds:
        # each just reset, its first observation in first_obs)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.timing = TimeSplit()
        """This group's seconds (it may run in a thread): in the env engine's steps ("env"), its
        seeded resets ("reset": a round's, or with Atari pools each pair's or, with env seeds,
        each env's first, for which ALE reloads the ROM), waiting for its turn to step ("turn",
        see `SlotPlayer`), the networks ("inference"), waiting for parameters ("params") and the
        rest of its loop ("other": bookkeeping, copies, waiting for the GIL), which add up to the
        time it played."""
        self.prefetch: Prefetch  # this play's parameter rows, in `pairs` order

    @contextlib.contextmanager
    def own_stream(self) -> Iterator[None]:
        """On CUDA, the calling thread queues its GPU work on this group's own stream, so that
        fetching the group's actions waits for its own networks alone (on one stream it would
        also wait for every other group's work queued before), and groups' networks can run at
        once. The stream first waits for the work queued on the default stream, and the default
        stream, at the end, for the group's."""
        if self.stream is None:
            yield
            return
        default = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(default)
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            default.wait_stream(self.stream)


class SlotPlayer:
    """One `evaluate` call's (individual, episode) pairs played through the slot groups: each
    pair's return, length and (with `sums`) observation sums are written at its index.

    Args:
        net: the K-slot population network.
        resets: drive the pools by resets (Atari) rather than rounds.
        seed: pair j plays in an env reset with seed `seed + j`.
        pair_seeds: with resets, a seeded reset for every pair (False: one per env per `play`,
            the module docstring says what then changes).
        params: individual indices -> their flat parameter rows.
        owner: (pairs,) the individual of each pair.
        returns, lengths: (pairs,) arrays to fill.
        sums: (pairs, 2, obs dim) observation sums and sums of squares to add to, or None.
        in_flight: counts the groups' pools in flight (sent, not yet received) over time.
        turns: with resets (each group in a thread of its own), the groups' pools step one at a
            time, in turn (see the module docstring).
    """

    def __init__(
        self,
        net: PopulationNet,
        resets: bool,
        seed: int,
        pair_seeds: bool,
        params: Callable[[np.ndarray], torch.Tensor],
        owner: np.ndarray,
        returns: np.ndarray,
        lengths: np.ndarray,
        sums: np.ndarray | None,
        in_flight: InFlight,
        turns: bool,
    ) -> None:
        self.net, self._resets, self._seed, self._pair_seeds = net, resets, seed, pair_seeds
        self._params, self._owner = params, owner
        self._returns, self._lengths, self._sums = returns, lengths, sums
        self._flight = in_flight
        self._turn = threading.Lock() if turns and resets else None
        """Held by the group whose pool is stepping (with `turns`, groups in threads only: one
        thread driving several pools in flight would wait for itself)."""

    def play(self, groups: list[SlotGroup]) -> None:
        """Play every pair (group k takes pairs k, k + len(groups), ...)."""
        num_pairs = self._owner.size
        for k, g in enumerate(groups):
            g.pairs = np.arange(k, num_pairs, len(groups), dtype=np.int64)
            g.round_start = g.next = 0
            g.prefetch = Prefetch(self._params, self._owner[g.pairs], g.size,
                                  4 * self.net.num_params, f"onebox-params-{k}")  # fmt: skip
        self._flight.open()
        try:
            if self._resets:
                self._play_threads(groups)
                return
            with _rest_as_other(groups[0], groups):  # one thread plays every group
                running = [g for g in groups if self._start_round(g)]
                while running:
                    running = [g for g in running if self._step(g)]
        finally:
            self._flight.close()
            for g in groups:
                g.prefetch.close()

    def _send(self, g: SlotGroup, *args: Any) -> None:
        """Send g's pool a step (`pool.send(*args)`), with `turns` once it is g's turn; the pool
        is in flight (and holds the turn) until `_recv`."""
        if self._turn is not None:
            with g.timing("turn"):
                self._turn.acquire()
        try:
            with g.timing("env"):
                g.pool.send(*args)
        except BaseException:
            if self._turn is not None:
                self._turn.release()
            raise
        self._flight.start()

    def _recv(self, g: SlotGroup) -> tuple[Any, ...]:
        """g's pool's results (`pool.recv()`); the pool is back and hands the turn on."""
        try:
            with g.timing("env"):
                result = g.pool.recv()
        finally:
            self._flight.stop()  # first: the next group's send counts after this pool is back
            if self._turn is not None:
                self._turn.release()
        return result

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        """A pool's blocking call (a reset): in flight while it runs."""
        self._flight.start()
        try:
            yield
        finally:
            self._flight.stop()

    # ---- rounds (native and process pools) ----------------------------------------------------

    def _start_round(self, g: SlotGroup) -> bool:
        """Reset g's pool with the next round's seeds and start its slots; False if none left."""
        g.round_start = g.next
        chunk = g.pairs[g.round_start : g.round_start + g.num_envs]
        if chunk.size == 0:
            return False
        seeds = np.full(g.num_envs, self._seed, dtype=np.uint64)
        seeds[: chunk.size] += chunk.astype(np.uint64)
        with g.timing("reset"), self._in_flight():
            g.pool.async_reset(seeds.tolist())
            for _ in range(g.num_envs // g.size):
                obs, *_, info = g.pool.recv()
                g.first_obs[info["env_id"]] = obs
        g.slot_pair[:] = -1
        g.slot_env[:] = -1
        g.env_slot[:] = -1
        g.running = g.size
        self._refill(g, np.arange(g.size))
        spare = np.arange(chunk.size, g.num_envs, dtype=np.int64)  # envs with no pair this round
        self._dispatch(g, spare)
        return True

    def _step(self, g: SlotGroup) -> bool:
        """Receive g's batch, finish and refill episodes, send the next actions; False when done."""
        obs, rew, term, trunc, info = self._recv(g)
        ids = info["env_id"]
        cont = self._collect(g, obs, rew, term, trunc, ids)
        keep = np.ones(len(ids), dtype=bool)
        keep[cont] = False
        if self._dispatch(g, ids[keep].astype(np.int64)):
            return True
        return self._start_round(g)

    # ---- resets (Atari pools) -----------------------------------------------------------------

    def _play_threads(self, groups: list[SlotGroup]) -> None:
        """Play every group's pairs, each group in its own thread; re-raise the first error."""
        stop = threading.Event()
        errors: list[BaseException] = []

        def play(g: SlotGroup) -> None:
            inherit_torch_threads()
            try:
                with _rest_as_other(g, [g]), g.own_stream():
                    self._play(g, stop)
            except BaseException as e:
                errors.append(e)
                stop.set()

        threads = [
            threading.Thread(target=play, args=(g,), name=f"onebox-evaluator-{k}", daemon=True)
            for k, g in enumerate(groups)
        ]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        finally:
            stop.set()  # after Ctrl-C here, the groups stop at their next step
            for t in threads:
                t.join()
        if errors:
            raise errors[0]

    def _play(self, g: SlotGroup, stop: threading.Event) -> None:
        """Play g's pairs through its synchronous pool until none is left (or `stop`)."""
        g.slot_pair[:] = -1
        g.slot_env[:] = -1
        g.env_slot[:] = -1
        g.idle = list(range(g.num_envs - 1, -1, -1))  # popped from the end: env 0 first
        if not self._pair_seeds:  # env e takes the group's pair e first (see _reset_envs)
            first = g.pairs[: g.num_envs]
            spare = np.arange(first.size, g.num_envs) + self._owner.size + g.lo  # no pair's seed
            seeds = self._seed + np.concatenate([first, spare]).astype(np.uint64)
            with g.timing("reset"), self._in_flight():
                g.first_obs[:], _ = g.pool.reset(seed=seeds.tolist())
            g.resetting[:] = False
        g.running = g.size
        self._refill(g, np.arange(g.size))
        while not stop.is_set() and self._dispatch(g, None):
            obs, rew, term, trunc, info = self._recv(g)
            self._collect(g, obs, rew, term, trunc, info["env_id"])

    def _reset_envs(self, g: SlotGroup, envs: np.ndarray, pairs: np.ndarray) -> np.ndarray:
        """The first observations of g's `envs` for `pairs`: with pair seeds each env is reset
        with its pair's seed (the others untouched); without, they were reset already."""
        if not self._pair_seeds:
            return g.first_obs[envs]
        with g.timing("reset"), self._in_flight():
            obs, _ = g.pool.reset_envs(envs, [self._seed + int(j) for j in pairs])
        return obs

    # ---- both ---------------------------------------------------------------------------------

    def _collect(
        self,
        g: SlotGroup,
        obs: np.ndarray,
        rew: np.ndarray,
        term: np.ndarray,
        trunc: np.ndarray,
        ids: np.ndarray,
    ) -> np.ndarray:
        """Add a received batch to its slots' episodes, record and refill the ended ones; return
        the batch rows whose episodes go on. Rows of envs without a slot are ignored, but for
        the reset steps of envs that wait for one (env seeds), whose envs become free."""
        if self._resets and not self._pair_seeds:
            reset = np.flatnonzero(g.resetting[ids])
            envs = ids[reset]
            g.first_obs[envs] = obs[reset]
            g.resetting[envs] = False
            g.idle[:0] = envs[::-1].tolist()  # popped from the end: the lowest id first
        slot = g.env_slot[ids]
        rows = np.flatnonzero(slot >= 0)
        s = slot[rows]
        g.ret[s] += rew[rows]
        g.len[s] += 1
        ended = term[rows] | trunc[rows]
        cont, fin = rows[~ended], s[ended]
        g.obs[slot[cont]] = obs[cont]
        if fin.size:
            pairs = g.slot_pair[fin]
            self._returns[pairs] = g.ret[fin]
            self._lengths[pairs] = g.len[fin]
            envs = g.slot_env[fin]
            g.env_slot[envs] = -1
            g.slot_pair[fin] = -1
            g.slot_env[fin] = -1
            if self._resets and not self._pair_seeds:
                g.resetting[envs] = True
            elif self._resets:
                g.idle.extend(envs.tolist())
            self._refill(g, np.sort(fin))
        if self._resets and not self._pair_seeds:
            self._refill_tail(g)
        return cont

    def _refill(self, g: SlotGroup, free: np.ndarray) -> None:
        """Start the next queued pairs in the free slots `free` (as many as there are free envs);
        keep the running slots a prefix."""
        take = self._startable(g, free.size)
        if take:
            self._start(g, free[:take])
        holes = free[take:]
        if holes.size == 0:
            return
        # Move the last running slots into the holes below the new end of the running prefix.
        end = g.running - holes.size
        dst = holes[holes < end]
        tail = np.arange(end, g.running)
        src = tail[g.slot_pair[tail] >= 0]
        g.running = end
        if dst.size == 0:
            return
        for a in (g.slot_pair, g.slot_env, g.ret, g.len, g.obs):
            a[dst] = a[src]
        g.slot_pair[src] = -1
        g.slot_env[src] = -1
        g.env_slot[g.slot_env[dst]] = dst
        with g.timing("inference"):
            self.net.move_slots(torch.from_numpy(dst + g.lo), torch.from_numpy(src + g.lo))

    def _refill_tail(self, g: SlotGroup) -> None:
        """Start queued pairs in the free slots past the running prefix, where envs have come
        free since those slots were left empty (env seeds: an env waits a step for its reset)."""
        take = self._startable(g, g.size - g.running)
        if take:
            g.running += take
            self._start(g, np.arange(g.running - take, g.running))

    def _startable(self, g: SlotGroup, slots: int) -> int:
        """How many queued pairs can start now in up to `slots` free slots."""
        end = g.pairs.size if self._resets else min(g.round_start + g.num_envs, g.pairs.size)
        take = min(slots, end - g.next)
        return min(take, len(g.idle)) if self._resets else take

    def _start(self, g: SlotGroup, new: np.ndarray) -> None:
        """Start the next `len(new)` queued pairs in the free slots `new`."""
        take = new.size
        pairs = g.pairs[g.next : g.next + take]
        if self._resets:
            envs = np.array([g.idle.pop() for _ in range(take)], dtype=np.int64)
            g.obs[new] = self._reset_envs(g, envs, pairs)
        else:
            envs = np.arange(g.next - g.round_start, g.next - g.round_start + take)
            g.obs[new] = g.first_obs[envs]
        g.next += take
        g.slot_pair[new] = pairs
        g.slot_env[new] = envs
        g.env_slot[envs] = new
        g.ret[new] = 0.0
        g.len[new] = 0
        with g.timing("params"):  # waiting for rows the prefetcher has not made yet
            flat = g.prefetch.take(take)
        with g.timing("inference"):
            self.net.set_slots(torch.from_numpy(new + g.lo), flat)

    def _dispatch(self, g: SlotGroup, spare: np.ndarray | None) -> bool:
        """Run the running slots' networks and send their actions; False if no slot runs.

        Rounds (`spare` given): the batch is topped up to the group size with `spare` envs and
        zero actions. Resets (`spare` None): every env of the pool is sent, the idle ones a zero
        action (a no-op).
        """
        n = g.running
        if n == 0:  # with env seeds, slots can all wait for their envs' reset step
            if spare is not None or not g.resetting.any() or g.next == g.pairs.size:
                return False
            space = g.pool.action_space
            self._send(g, np.zeros(space.shape, dtype=space.dtype))
            return True
        obs = g.obs[:n]
        with g.timing("inference"):
            actions = self.net.act(g.staging(obs), slice(g.lo, g.lo + n))
        if self._sums is not None:
            x = obs.astype(np.float64)
            pairs = g.slot_pair[:n]
            self._sums[pairs, 0] += x
            self._sums[pairs, 1] += x * x
        ids = g.slot_env[:n]
        if spare is None:
            full = np.zeros((g.num_envs, *actions.shape[1:]), dtype=actions.dtype)
            full[ids] = actions
            self._send(g, full)
            return True
        fill = g.size - n
        if fill:
            ids = np.concatenate([ids, spare[:fill]])
            pad = np.zeros((fill, *actions.shape[1:]), dtype=actions.dtype)
            actions = np.concatenate([actions, pad])
        self._send(g, actions, ids)
        return True
