"""Population evaluation with continuous batching: K network slots over the async env engine.

`PopulationEvaluator.evaluate(params, episodes, seed)` plays `episodes[i]` episodes of individual
`i` for every individual and returns each episode's true (unclipped, summed) return.

How the episodes are played: the engine's closed-loop rollouts where the network fits them
(`rollout_ok`), else K network slots in pipelined groups (two by default) with continuous
batching (`onebox.evo.slots`, whose docstring tells how). Either way pair j (individual-major
order) always plays in an env reset with seed `seed + j`, whatever K, the thread count or the
timing, unless `episode_seeds="env"` (Atari only) trades that for resets without a ROM reload.

Fitness is the true episode return: Atari pools run with `episodic_life=False` and
`reward_clip=False`, so an episode is a whole game and its rewards are the game's score. Frames:
`frames_per_step` per env step (the env's frame skip: 4 for Atari, else 1), counted for real
episodes only. The episode cap `max_episode_steps` (default: the env's own limit) is in env steps;
for Atari it becomes ALE's frame cap, `max_episode_steps * frameskip` frames. An env without a time
limit of its own gets `onebox.envs.base.EPISODE_CAP` steps by default, with a warning: one
individual whose episode never ends would otherwise stall its generation.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

import onebox.envs
from onebox.envs.base import EPISODE_CAP, cap_options, time_limit
from onebox.evo.slots import SlotGroup, SlotPlayer
from onebox.nn.accel import resolve_device
from onebox.nn.population import OBS_CLIP, Arch, DType, PopulationNet, default_arch
from onebox.run import InFlight, TimeSplit

EpisodeSeeds = Literal["pair", "env"]
"""How episodes are seeded (`PopulationEvaluator`'s `episode_seeds`)."""

ParamSource = torch.Tensor | Callable[[np.ndarray], torch.Tensor]
"""Individuals' flat parameters: an (N, num_params) tensor, or a function from individual indices
to their (n, num_params) rows (so a large population need not be held in memory at once). The
slot groups call it from helper threads, one individual at a time, in their queue order, ahead of
the slots (`onebox.evo.prefetch`): it must be safe to call from several threads at once."""


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


class PopulationEvaluator:
    """Evaluates populations of networks on one env id with continuous batching.

    Args:
        env_id: a onebox env id (native, Atari or any Gymnasium id).
        arch: network architecture, "mlp", "cnn" or "minatar" (default: by observation space,
            `default_arch`).
        hidden: hidden sizes (see `PopulationNet`).
        num_slots: K, networks run at once, split evenly among the slot groups (default: 256
            for the mlp; 64 for the cnn, whose parameters take hundreds of times the memory, and
            for the minatar network, whose 0.5 MB dense layer per network bounds a CPU step by
            memory bandwidth beyond a cache's worth: 64 ran 1.2-1.3x the frames/s of 256,
            docs/benchmarks.md).
        slot_groups: G, groups of slots, each with its own env pool: while one group's networks
            run, the other groups' envs step (default 2). More groups keep more pools in flight
            at once, with smaller network batches.
        num_threads: engine worker threads (or processes) per group pool (default: physical
            cores / G; all of them for Atari pools stepped in turn, `pool_turns`).
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
        episode_seeds: "pair": every (individual, episode) pair plays in an env reset with its
            own seed, so fitnesses do not depend on K, threads or timing; ALE reloads the ROM
            for such a reset (about 0.1 s of CPU an episode). "env" (Atari only): each env is
            reset with a seed once per `evaluate` and its later episodes start unseeded, with no
            reload; fitnesses then depend on K (`onebox.evo.slots` says how).
        pool_turns: Atari (each group in a thread of its own): the groups' pools step one at a
            time, each with every engine core, while the other groups run their networks
            (`onebox.evo.slots` says why); False lets them step at once, sharing the cores.
            Default: in turn where the networks run on a GPU, at once on the CPU, where the
            networks need the cores too (there the two measured the same, docs/benchmarks.md).
            Fitnesses do not depend on it.
    """

    def __init__(
        self,
        env_id: str,
        *,
        arch: Arch | None = None,
        hidden: tuple[int, ...] | None = None,
        num_slots: int | None = None,
        slot_groups: int = 2,
        num_threads: int | None = None,
        max_episode_steps: int | None = None,
        max_envs: int = 4096,
        device: str | torch.device = "cpu",
        dtype: DType = "float32",
        frames_per_step: int | None = None,
        backend: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        native_rollout: bool = True,
        episode_seeds: EpisodeSeeds = "pair",
        pool_turns: bool | None = None,
    ) -> None:
        if isinstance(slot_groups, bool) or not isinstance(slot_groups, int) or slot_groups < 1:
            raise ValueError(f"slot_groups must be an integer >= 1, got {slot_groups!r}")
        if num_slots is not None and (
            isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < slot_groups
        ):
            raise ValueError(
                f"num_slots must be an integer >= slot_groups ({slot_groups}: a slot per group), "
                f"got {num_slots}"
            )
        if num_threads is not None and (
            isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1
        ):
            raise ValueError(f"num_threads must be an integer >= 1 or None, got {num_threads!r}")
        device = resolve_device(str(device))
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
        if episode_seeds not in ("pair", "env"):
            raise ValueError(f"episode_seeds must be 'pair' or 'env', got {episode_seeds!r}")
        if episode_seeds == "env" and not self._resets:
            raise ValueError(
                f"episode_seeds='env' is for Atari pools, whose seeded resets reload the ROM; "
                f"the {chosen} backend of {env_id!r} seeds every episode at no cost: leave 'pair'"
            )
        self.episode_seeds = episode_seeds
        self.max_envs = max_envs
        if pool_turns and not self._resets:
            raise ValueError(
                f"pool_turns (--pool-turns) is for Atari pools, each slot group in a thread of "
                f"its own; the {chosen} backend of {env_id!r} plays its groups in one thread, "
                "their pools in flight together: leave it unset"
            )
        if pool_turns is None:
            pool_turns = device.type == "cuda"
        self.pool_turns = bool(pool_turns and self._resets)
        """Whether the slot groups' pools step in turn (Atari pools only)."""
        if num_threads is None:
            cores = onebox.envs.physical_cores()
            num_threads = cores if self.pool_turns else max(1, cores // slot_groups)
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
            self._spec = probe.spec
            kwargs = probe.spec.kwargs if probe.spec is not None else {}
        finally:
            probe.close()
        if self.max_episode_steps is None and time_limit(self._spec) is None:
            self.max_episode_steps = EPISODE_CAP
            warnings.warn(
                f"{env_id} has no time limit: evaluation episodes end at {EPISODE_CAP:,} steps "
                "(an individual that never ends its episode would stall its generation); pass "
                "max_episode_steps (--max-episode-steps) to choose the cap",
                stacklevel=2,
            )
        skip = kwargs.get("frame_skip", kwargs.get("frameskip", 1))
        self._skip = skip if isinstance(skip, int) else 1
        self.frames_per_step = int(frames_per_step or self._skip)
        arch = arch or default_arch(self.observation_space)
        if num_slots is None:
            num_slots = 256 if arch == "mlp" else 64
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
        base, extra = divmod(num_slots, slot_groups)  # the larger groups last
        self.sizes = tuple(base + (k >= slot_groups - extra) for k in range(slot_groups))
        self._groups: list[SlotGroup] = []
        self.frames = 0
        """Frames used by every `evaluate` call so far (the budget's counter)."""
        self.timing = TimeSplit()
        """Seconds in the env engine's steps ("env"), its seeded resets ("reset"), waiting for a
        turn to step ("turn", `pool_turns`), the networks ("inference"), waiting for parameters
        ("params") and the rest of the slot groups' loops ("other"), summed over the slot groups
        (with Atari each group runs in a thread of its own); the native rollouts count as "env"."""
        self.in_flight = InFlight()
        """How long 0, 1, 2, ... of the slot groups' pools were in flight at once (sent, not
        yet received: stepping, or, in one thread, done and waiting to be received) while the
        slot groups played."""

    def _make(self, num_envs: int, batch_size: int, num_threads: int, cap: bool = True) -> Any:
        kwargs = dict(self.env_kwargs)
        if cap and self.max_episode_steps is not None:
            kwargs |= cap_options(self._spec, self.max_episode_steps)
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
                    self._groups.append(
                        SlotGroup(pool, lo, size, self.net.obs_shape, self.net.device)
                    )
                    lo += size
            return
        envs = []
        for size in self.sizes:
            want = min(max(math.ceil(num_pairs / len(self.sizes)), size),
                       self.max_envs // len(self.sizes))  # fmt: skip
            envs.append(size * max(1, math.ceil(want / size)))
        if self._groups and all(g.num_envs >= n for g, n in zip(self._groups, envs, strict=True)):
            return
        self.close()
        lo = 0
        for size, num_envs in zip(self.sizes, envs, strict=True):
            pool = self._make(num_envs, size, min(self.num_threads, num_envs))
            self._groups.append(SlotGroup(pool, lo, size, self.net.obs_shape, self.net.device))
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
            pair_seeds = self.episode_seeds == "pair"
            player = SlotPlayer(self.net, self._resets, self._seed, pair_seeds, source, owner,
                                self._returns, self._lengths, self._sums,
                                self.in_flight, self.pool_turns)  # fmt: skip
            try:
                player.play(self._groups)
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
