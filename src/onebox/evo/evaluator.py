"""Population evaluation with continuous batching: K network slots over the async env engine.

`PopulationEvaluator.evaluate(params, episodes, seed)` plays `episodes[i]` episodes of individual
`i` for every individual and returns each episode's true (unclipped, summed) return.

How it runs:
- The K slots are split into two groups, each with its own env pool. While one group's envs step
  on the engine's threads, the other group's networks run, so simulation and inference overlap.
- Each slot plays one episode of one individual. Each step only the running slots' networks are
  computed: running slots are kept a prefix of the group's slots, so the networks read the stacked
  parameters in place. When an episode ends its slot is refilled at once with the next
  (individual, episode) pair from the queue (the individual's parameters are copied into the slot);
  with the queue empty, the last running slot moves into the hole.
- Determinism: pair j (individual-major order) always plays in an env reset with seed
  `seed + j`, whatever K, the thread count or the timing.

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
  resets overlap the other's steps and inference.

Fitness is the true episode return: Atari pools run with `episodic_life=False` and
`reward_clip=False`, so an episode is a whole game and its rewards are the game's score. Frames:
`frames_per_step` per env step (the env's frame skip: 4 for Atari, else 1), counted for real
episodes only. The episode cap `max_episode_steps` (default: the env's own limit) is in env steps;
for Atari it becomes ALE's frame cap, `max_episode_steps * frameskip` frames.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import onebox.envs
from onebox.nn.population import OBS_CLIP, Arch, DType, PopulationNet, default_arch
from onebox.run import TimeSplit

ParamSource = torch.Tensor | Callable[[np.ndarray], torch.Tensor]
"""Individuals' flat parameters: an (N, num_params) tensor, or a function from individual indices
to their (n, num_params) rows (so a large population need not be held in memory at once)."""


@dataclass
class ObsStats:
    """Sums over observations fed to the networks, for running normalization."""

    count: float
    total: np.ndarray
    total_sq: np.ndarray


@dataclass
class EvalResult:
    """The outcome of one `evaluate` call; arrays are per (individual, episode) pair."""

    returns: np.ndarray
    """(pairs,) float64 true episode returns, individual-major."""
    lengths: np.ndarray
    """(pairs,) int64 env steps per episode."""
    owner: np.ndarray
    """(pairs,) int64 the individual each pair belongs to."""
    frames: int
    """Env frames these episodes used (steps x frames_per_step)."""
    obs_stats: ObsStats | None
    """Observation sums, when asked for."""
    pair_obs_sums: np.ndarray | None = None
    """(pairs, 2, obs dim) each pair's sums behind `obs_stats`, so that results of parts of a
    population join exactly (`onebox.cluster.evolve_hosts`)."""

    def fitness(self) -> np.ndarray:
        """Mean return of each individual over its episodes."""
        n = int(self.owner.max()) + 1 if self.owner.size else 0
        counts = np.bincount(self.owner, minlength=n)
        return np.bincount(self.owner, weights=self.returns, minlength=n) / np.maximum(counts, 1)


class _Group:
    """One slot group: a contiguous range of network slots and the engine pool behind them."""

    def __init__(self, pool: Any, lo: int, size: int, obs_shape: tuple[int, ...]) -> None:
        self.pool, self.lo, self.size = pool, lo, size
        self.num_envs = pool.num_envs
        dtype = pool.single_observation_space.dtype
        self.obs = np.zeros((size, *obs_shape), dtype=dtype)
        self.first_obs = np.zeros((self.num_envs, *obs_shape), dtype=dtype)
        self.slot_pair = np.full(size, -1, dtype=np.int64)
        self.slot_env = np.full(size, -1, dtype=np.int64)
        self.env_slot = np.full(self.num_envs, -1, dtype=np.int64)
        self.ret = np.zeros(size, dtype=np.float64)
        self.len = np.zeros(size, dtype=np.int64)
        self.pairs = np.zeros(0, dtype=np.int64)  # this group's pairs, in order
        self.round_start = 0  # index in `pairs` of the current round's first pair
        self.next = 0  # index in `pairs` of the next pair to start
        self.running = 0  # slots [0, running) play episodes; the rest are free
        self.idle: list[int] = []  # resets: envs without a pair, for the next pairs
        self.timing = TimeSplit()  # this group's env and inference seconds (it may run in a thread)


class PopulationEvaluator:
    """Evaluates populations of networks on one env id with continuous batching.

    Args:
        env_id: a onebox env id (native, Atari or any Gymnasium id).
        arch: network architecture, "mlp", "cnn" or "minatar" (default: by observation space,
            `default_arch`).
        hidden: hidden sizes (see `PopulationNet`).
        num_slots: K, networks run at once, in two groups of about K/2 (default: 256 for the
            mlp, 64 for the cnn, whose parameters take hundreds of times the memory).
        num_threads: engine worker threads (or processes) per group pool (default: physical
            cores / 2).
        max_episode_steps: episode cap in env steps (default: the env's own limit).
        max_envs: most envs held in total by the rounds of native and process pools (one per
            queued episode; more episodes play in rounds). Atari pools hold one env per slot.
        device: torch device for the networks.
        dtype: network precision, "float32", "bfloat16" or "float16" (see `PopulationNet`).
        frames_per_step: frames counted per env step (default: the env's frame skip, else 1).
        backend: the env backend (default: the one `onebox.envs.make` picks for `env_id`).
        env_kwargs: the env's own options.
        native_rollout: evaluate with the engine's closed-loop rollouts where the network fits
            them (see `rollout_ok`).
    """

    def __init__(
        self,
        env_id: str,
        *,
        arch: Arch | None = None,
        hidden: tuple[int, ...] | None = None,
        num_slots: int | None = None,
        num_threads: int | None = None,
        max_episode_steps: int | None = None,
        max_envs: int = 4096,
        device: str | torch.device = "cpu",
        dtype: DType = "float32",
        frames_per_step: int | None = None,
        backend: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        native_rollout: bool = True,
    ) -> None:
        if num_slots is not None and (
            isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 2
        ):
            raise ValueError(
                f"num_slots must be an integer >= 2 (two slot groups), got {num_slots}"
            )
        if isinstance(max_envs, bool) or not isinstance(max_envs, int):
            raise ValueError(f"max_envs must be an integer, got {max_envs!r}")
        if max_episode_steps is not None and (
            isinstance(max_episode_steps, bool)
            or not isinstance(max_episode_steps, int)
            or max_episode_steps < 1
        ):
            raise ValueError(
                f"max_episode_steps must be a positive integer or None, got {max_episode_steps!r}"
            )
        if not isinstance(env_id, str):
            raise TypeError(f"env_id must be a string, got {type(env_id).__name__}")
        chosen = backend if backend is not None else onebox.envs.backend_of(env_id)
        if chosen is None:
            raise ValueError(
                f"{env_id!r} is not an env id onebox can make; `onebox envs` lists them"
            )
        if chosen not in onebox.envs.BACKENDS:
            raise ValueError(
                f"unknown backend {chosen!r}; choose one of {', '.join(onebox.envs.BACKENDS)}"
            )
        self.env_id = env_id
        self.backend = chosen
        self._backend_arg = backend  # None: `make` chooses (and warns if it has to fall back)
        self._resets = chosen == "atari"  # see the module docstring: rounds or resets
        self.max_envs = max_envs
        if num_threads is None:
            num_threads = max(1, onebox.envs.physical_cores() // 2)
        self.num_threads = num_threads
        self.max_episode_steps = max_episode_steps
        self.env_kwargs = dict(env_kwargs or {})
        if self._resets:
            for name, effect in (
                ("episodic_life", "end episodes at a lost life"),
                ("reward_clip", "clip the rewards"),
            ):
                if self.env_kwargs.get(name, False):
                    raise ValueError(
                        f"fitness is the true whole-game score, and {name}=True would {effect}; "
                        "leave it False"
                    )
                self.env_kwargs[name] = False
        probe = self._make(1, 1, 1, cap=False)
        try:
            self.observation_space = probe.single_observation_space
            self.action_space = probe.single_action_space
            kwargs = probe.spec.kwargs if probe.spec is not None else {}
        finally:
            probe.close()
        skip = kwargs.get("frame_skip", kwargs.get("frameskip", 1))
        self._skip = skip if isinstance(skip, int) else 1
        self.frames_per_step = int(frames_per_step or self._skip)
        arch = arch or default_arch(self.observation_space)
        if num_slots is None:
            num_slots = 64 if arch == "cnn" else 256
        if max_envs < num_slots:
            raise ValueError(f"max_envs must be >= num_slots={num_slots}, got {max_envs}")
        self.num_slots = num_slots
        self.net = PopulationNet(
            arch,
            self.observation_space,
            self.action_space,
            num_slots,
            hidden=hidden,
            device=device,
            dtype=dtype,
        )
        self.num_params = self.net.num_params
        self.rollout_ok = (
            native_rollout
            and chosen == "native"
            and arch == "mlp"
            and len(self.net.layers) <= 2
            and self.net.device.type == "cpu"
            and dtype == "float32"
        )
        """Whether `evaluate` runs whole episodes in the engine (`NativeEnvPool.rollout`: the
        network in C++, no Python per step) instead of the slot groups: for native envs and a
        float32 mlp on the CPU with at most one hidden layer (linear, `hidden=()`, or one tanh
        layer). The C++ policy computes in float64, so returns can differ from the slot groups'
        float32 networks in the last digits, and an action chosen by argmax can differ where two
        outputs tie that closely."""
        self._rollout_pool: Any = None
        self.sizes = (num_slots // 2, num_slots - num_slots // 2)
        self._groups: list[_Group] = []
        self.frames = 0
        """Frames used by every `evaluate` call so far (the budget's counter)."""
        self.timing = TimeSplit()
        """Seconds spent in the env engine ("env") and in the networks ("inference"), summed over
        the slot groups (with Atari they run in two threads at once)."""

    def _make(self, num_envs: int, batch_size: int, num_threads: int, cap: bool = True) -> Any:
        kwargs = dict(self.env_kwargs)
        if cap and self.max_episode_steps is not None:
            if self._resets:  # ALE caps frames of steps (not counting the reset's no-ops)
                kwargs["max_num_frames_per_episode"] = self.max_episode_steps * self._skip
            else:
                kwargs["max_episode_steps"] = self.max_episode_steps
        return onebox.envs.make(
            self.env_id,
            num_envs,
            batch_size=batch_size,
            num_threads=num_threads,
            backend=self._backend_arg,
            copy=False,
            **kwargs,
        )

    def make_env(self, num_envs: int = 1) -> Any:
        """A synchronous pool of this evaluator's env with its options (Atari: whole games with
        the true score) and episode cap, e.g. to replay individuals outside the evaluator."""
        return self._make(num_envs, num_envs, min(self.num_threads, num_envs))

    def _ensure_pools(self, num_pairs: int) -> None:
        """Make the pools: for rounds, (re)made as needed so one round holds `num_pairs` pairs
        (up to `max_envs`); for resets, one synchronous pool of one env per slot per group."""
        if self._resets:
            if not self._groups:
                lo = 0
                for size in self.sizes:
                    pool = self._make(size, size, min(self.num_threads, size))
                    pool.reset(seed=0)  # partial resets need a full one first
                    self._groups.append(_Group(pool, lo, size, self.net.obs_shape))
                    lo += size
            return
        envs = []
        for size in self.sizes:
            want = min(max(math.ceil(num_pairs / len(self.sizes)), size), self.max_envs // 2)
            envs.append(size * max(1, math.ceil(want / size)))
        if self._groups and all(g.num_envs >= n for g, n in zip(self._groups, envs, strict=True)):
            return
        self.close()
        lo = 0
        for size, num_envs in zip(self.sizes, envs, strict=True):
            pool = self._make(num_envs, size, min(self.num_threads, num_envs))
            self._groups.append(_Group(pool, lo, size, self.net.obs_shape))
            lo += size

    @property
    def pools(self) -> list[Any]:
        """The engine pools of the slot groups (made by the first `evaluate`)."""
        return [g.pool for g in self._groups]

    def close(self) -> None:
        """Close the env pools."""
        for g in self._groups:
            g.pool.close()
        self._groups = []
        if self._rollout_pool is not None:
            self._rollout_pool.close()
            self._rollout_pool = None

    def __enter__(self) -> PopulationEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- evaluate -----------------------------------------------------------------------------

    def evaluate(
        self,
        params: ParamSource,
        episodes: int | np.ndarray,
        seed: int,
        *,
        obs_norm: tuple[np.ndarray, np.ndarray] | None = None,
        obs_stats: bool = False,
    ) -> EvalResult:
        """Play `episodes` (an int or one per individual) episodes of each row of `params`.

        Args:
            params: (N, num_params) flat parameter vectors, one per individual, or a function
                from individual indices to their rows (then `episodes` must be an array of N).
            episodes: episodes per individual.
            seed: pair j (individual-major) plays in an env reset with seed `seed + j`.
            obs_norm: (mean, std) to normalize observations with, or None.
            obs_stats: also return sums over the observations fed to the networks.
        """
        if callable(params):
            if np.ndim(episodes) != 1:
                raise ValueError(
                    "with a parameter function, episodes must be one count per individual"
                )
            n = len(episodes)
            source = params
        else:
            table = torch.as_tensor(params)
            if table.ndim != 2 or table.shape[1] != self.num_params:
                raise ValueError(
                    f"params must have shape (N, {self.num_params}), got {tuple(table.shape)}"
                )
            n = table.shape[0]

            def source(idx: np.ndarray) -> torch.Tensor:
                return table[torch.from_numpy(idx)]

        eps = np.broadcast_to(np.asarray(episodes), (n,))
        if eps.dtype.kind not in "iu" or (eps < 0).any():
            raise ValueError("episodes must be non-negative integers")
        if not isinstance(seed, int | np.integer) or not 0 <= seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        owner = np.repeat(np.arange(n, dtype=np.int64), eps)
        num_pairs = owner.size
        self.net.set_obs_norm(*(obs_norm or (None, None)))
        self._params, self._owner, self._seed = source, owner, int(seed)
        self._returns = np.zeros(num_pairs, dtype=np.float64)
        self._lengths = np.zeros(num_pairs, dtype=np.int64)
        self._sums = None
        if obs_stats:
            if self.net.arch != "mlp":
                raise ValueError("obs_stats needs vector observations (arch='mlp')")
            dim = self.net.obs_shape[0]
            self._sums = np.zeros((num_pairs, 2, dim), dtype=np.float64)
        if num_pairs and self.rollout_ok:
            self._rollouts(obs_norm)
        elif num_pairs:
            self._ensure_pools(num_pairs)
            try:
                for g, group in enumerate(self._groups):
                    group.pairs = np.arange(g, num_pairs, len(self._groups), dtype=np.int64)
                    group.round_start = group.next = 0
                if self._resets:
                    self._play_threads()
                else:
                    running = [g for g in self._groups if self._start_round(g)]
                    while running:
                        running = [g for g in running if self._step(g)]
            except BaseException:
                self.close()  # the pools are left mid-step: the next call makes fresh ones
                raise
            for group in self._groups:
                for name, seconds in group.timing.totals().items():
                    self.timing.add(name, seconds)
                group.timing.reset()
        frames = int(self._lengths.sum()) * self.frames_per_step
        self.frames += frames
        stats = None
        if self._sums is not None:
            tot = self._sums.sum(axis=0)
            stats = ObsStats(float(self._lengths.sum()), tot[0], tot[1])
        return EvalResult(self._returns, self._lengths, owner, frames, stats, self._sums)

    # ---- native rollouts ----------------------------------------------------------------------

    def _rollouts(self, obs_norm: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Play every pair with `NativeEnvPool.rollout`, up to `max_envs` pairs per call; pair j
        in an env reset with seed `seed + j`, as in the slot groups."""
        num_pairs = self._owner.size
        size = min(num_pairs, self.max_envs)
        pool = self._rollout_pool
        if pool is None or pool.num_envs < size:  # grown only: a smaller call pads
            self.close()
            threads = min(self.num_threads * len(self.sizes), size)
            pool = self._rollout_pool = self._make(size, size, threads)
        mean, std = obs_norm if obs_norm is not None else (None, None)
        for start in range(0, num_pairs, pool.num_envs):
            idx = np.arange(start, min(start + pool.num_envs, num_pairs))
            weights = self._rollout_weights(self._params(self._owner[idx]))
            pad = pool.num_envs - len(idx)
            if pad:  # the spare envs replay the first pair; their results are dropped
                weights = np.concatenate([weights, np.repeat(weights[:1], pad, axis=0)])
            sums = None if self._sums is None else np.zeros((pool.num_envs, *self._sums.shape[1:]))
            with self.timing("env"):
                returns, lengths = pool.rollout(
                    weights,
                    hidden=self.net.layers[0].weight[1] if len(self.net.layers) == 2 else 0,
                    obs_mean=mean,
                    obs_std=std,
                    obs_clip=OBS_CLIP if obs_norm is not None else None,
                    squash=not self.net.discrete,
                    seed=self._seed + start,
                    obs_sums=sums,
                )
            self._returns[idx] = returns[: len(idx)]
            self._lengths[idx] = lengths[: len(idx)]
            if sums is not None:
                self._sums[idx] = sums[: len(idx)]

    def _rollout_weights(self, flat: torch.Tensor) -> np.ndarray:
        """`PopulationNet` parameter rows -> `rollout`'s layout: each layer's weight (stored
        `(in, out)`) transposed to `[out, in]`, then its bias."""
        flat = torch.as_tensor(flat, dtype=torch.float32).cpu()
        parts, k = [], 0
        for lay in self.net.layers:
            fan_in, fan_out = lay.weight
            size = fan_in * fan_out
            w = flat[:, k : k + size].reshape(-1, fan_in, fan_out).transpose(1, 2)
            parts += [w.reshape(len(flat), -1), flat[:, k + size : k + size + fan_out]]
            k += size + fan_out
        return torch.cat(parts, dim=1).numpy()

    # ---- rounds (native and process pools) ----------------------------------------------------

    def _start_round(self, g: _Group) -> bool:
        """Reset g's pool with the next round's seeds and start its slots; False if none left."""
        g.round_start = g.next
        chunk = g.pairs[g.round_start : g.round_start + g.num_envs]
        if chunk.size == 0:
            return False
        seeds = np.full(g.num_envs, self._seed, dtype=np.uint64)
        seeds[: chunk.size] += chunk.astype(np.uint64)
        with g.timing("env"):
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

    def _step(self, g: _Group) -> bool:
        """Receive g's batch, finish and refill episodes, send the next actions; False when done."""
        with g.timing("env"):
            obs, rew, term, trunc, info = g.pool.recv()
        ids = info["env_id"]
        cont = self._collect(g, obs, rew, term, trunc, ids)
        keep = np.ones(len(ids), dtype=bool)
        keep[cont] = False
        if self._dispatch(g, ids[keep].astype(np.int64)):
            return True
        return self._start_round(g)

    # ---- resets (Atari pools) -----------------------------------------------------------------

    def _play_threads(self) -> None:
        """Play every group's pairs, each group in its own thread; re-raise the first error."""
        stop = threading.Event()
        errors: list[BaseException] = []

        def play(g: _Group) -> None:
            try:
                self._play(g, stop)
            except BaseException as e:
                errors.append(e)
                stop.set()

        threads = [
            threading.Thread(target=play, args=(g,), name=f"onebox-evaluator-{k}", daemon=True)
            for k, g in enumerate(self._groups)
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

    def _play(self, g: _Group, stop: threading.Event) -> None:
        """Play g's pairs through its synchronous pool until none is left (or `stop`)."""
        g.slot_pair[:] = -1
        g.slot_env[:] = -1
        g.env_slot[:] = -1
        g.idle = list(range(g.num_envs - 1, -1, -1))  # popped from the end: env 0 first
        g.running = g.size
        self._refill(g, np.arange(g.size))
        while not stop.is_set() and self._dispatch(g, None):
            with g.timing("env"):
                obs, rew, term, trunc, info = g.pool.recv()
            self._collect(g, obs, rew, term, trunc, info["env_id"])

    def _reset_envs(self, g: _Group, envs: np.ndarray, pairs: np.ndarray) -> np.ndarray:
        """Seeded reset of g's `envs` for `pairs` (the others untouched); first observations."""
        with g.timing("env"):
            obs, _ = g.pool.reset_envs(envs, [self._seed + int(j) for j in pairs])
        return obs

    # ---- both ---------------------------------------------------------------------------------

    def _collect(
        self,
        g: _Group,
        obs: np.ndarray,
        rew: np.ndarray,
        term: np.ndarray,
        trunc: np.ndarray,
        ids: np.ndarray,
    ) -> np.ndarray:
        """Add a received batch to its slots' episodes, record and refill the ended ones; return
        the batch rows whose episodes go on. Rows of envs without a slot are ignored."""
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
            if self._resets:
                g.idle.extend(envs.tolist())
            self._refill(g, np.sort(fin))
        return cont

    def _refill(self, g: _Group, free: np.ndarray) -> None:
        """Start the next queued pairs in the free slots `free`; keep the running slots a prefix."""
        end = g.pairs.size if self._resets else min(g.round_start + g.num_envs, g.pairs.size)
        take = min(free.size, end - g.next)
        if take:
            new = free[:take]
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
            with g.timing("inference"):
                self.net.set_slots(torch.from_numpy(new + g.lo), self._params(self._owner[pairs]))
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

    def _dispatch(self, g: _Group, spare: np.ndarray | None) -> bool:
        """Run the running slots' networks and send their actions; False if no slot runs.

        Rounds (`spare` given): the batch is topped up to the group size with `spare` envs and
        zero actions. Resets (`spare` None): every env of the pool is sent, the idle ones a zero
        action (a no-op).
        """
        n = g.running
        if n == 0:
            return False
        obs = g.obs[:n]
        with g.timing("inference"):
            actions = self.net.act(torch.from_numpy(obs), slice(g.lo, g.lo + n))
        if self._sums is not None:
            x = obs.astype(np.float64)
            pairs = g.slot_pair[:n]
            self._sums[pairs, 0] += x
            self._sums[pairs, 1] += x * x
        ids = g.slot_env[:n]
        if spare is None:
            full = np.zeros((g.num_envs, *actions.shape[1:]), dtype=actions.dtype)
            full[ids] = actions
            with g.timing("env"):
                g.pool.send(full)
            return True
        fill = g.size - n
        if fill:
            ids = np.concatenate([ids, spare[:fill]])
            pad = np.zeros((fill, *actions.shape[1:]), dtype=actions.dtype)
            actions = np.concatenate([actions, pad])
        with g.timing("env"):
            g.pool.send(actions, ids)
        return True
