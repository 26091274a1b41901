"""Evaluation hosts on Ray: an evolution run's population spread over a cluster's machines.

Each host is a Ray actor process holding its own `PopulationEvaluator` (continuous batching on
its node's cores) and a replica of the run's algorithm (GA, ES, RS). Every round of ask and tell,
each replica asks exactly what the driver's algorithm asks (same state, same random stream) and
evaluates a contiguous share of the individuals: pair j of the population plays with env seed
`seed + j` wherever it runs, so the joined returns, and the generation's fitnesses, are those of a
run on one machine whatever the number of hosts. What crosses the network each round: the
joined returns (and, for ES/ARS, the observation sums) go to every replica, which tells its
algorithm as the driver does; the shares' returns come back. Parameters never travel: genomes
are seed lists, ES perturbations are seeds, and each replica rebuilds them. A host gets the
algorithm's full state (`state_dict`) only when it starts.

A host that dies mid-round is replaced by a new one (Ray places it on a node with room),
started from the algorithm's state before the round, and its share is evaluated again: no round
is lost, and none counted twice (frames come from the shares that returned). More than
`max_restarts` replacements of one host fail the run.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import torch

from onebox.cluster import import_ray
from onebox.evo.build import make_algorithm, make_evaluator
from onebox.evo.core import Algorithm, Generation
from onebox.evo.evaluator import EvalResult, ObsStats, PopulationEvaluator

ANSWER_TIMEOUT_S = 600.0
"""A host that has not returned its share within this time (its start included) is replaced."""


class EvalHost:
    """One evaluation host (run as a Ray actor): an evaluator and a replica of the algorithm,
    both made from the run's resolved `config` as the run makes its own (`onebox.evo.build`), the
    replica loaded with `state`."""

    def __init__(self, config: Any, state: dict[str, Any]) -> None:
        torch.set_num_threads(config.torch_threads)
        self.evaluator = make_evaluator(config)
        self.algo = make_algorithm(config, self.evaluator)
        self.algo.load_state_dict(state)

    def evaluate(self, told: EvalResult | None, lo: int, hi: int) -> dict[str, Any]:
        """Tell the replica the last round's joined result (None: it started after that round),
        ask, and evaluate individuals [lo, hi) of the ask."""
        if told is not None:
            self.algo.tell(told)
        ask = self.algo.ask()
        episodes = np.asarray(ask.episodes)
        params = ask.params
        if callable(params):
            source = params

            def share(idx: np.ndarray) -> torch.Tensor:
                return source(idx + lo)

            part: Any = share
        else:
            part = torch.as_tensor(params)[lo:hi]
        self.evaluator.timing.reset()
        result = self.evaluator.evaluate(part, episodes[lo:hi], ask.seed + int(episodes[:lo].sum()),
                                         obs_norm=ask.obs_norm, obs_stats=ask.obs_stats)  # fmt: skip
        return {"seed": ask.seed, "returns": result.returns, "lengths": result.lengths,
                "frames": result.frames, "sums": result.pair_obs_sums,
                "timing": self.evaluator.timing.totals()}  # fmt: skip

    def close(self) -> None:
        """Close the evaluator's env pools."""
        self.evaluator.close()


def shares(episodes: np.ndarray, hosts: int) -> list[tuple[int, int]]:
    """Contiguous individual ranges [lo, hi), one per host, of about equal episode counts."""
    cum = np.concatenate([[0], np.cumsum(episodes)])
    cuts = [0]
    for h in range(1, hosts):
        cuts.append(max(cuts[-1], int(np.searchsorted(cum, cum[-1] * h / hosts))))
    cuts.append(len(episodes))
    return list(itertools.pairwise(cuts))


class RayPopulation:
    """`hosts` evaluation hosts on the connected Ray cluster for the run of `config` (resolved),
    started from `algo`'s state; `step(algo, evaluator)` stands for `onebox.evo.run`'s
    `step_generation`, counting frames and times on the local `evaluator`."""

    def __init__(self, config: Any, hosts: int, algo: Algorithm, max_restarts: int) -> None:
        if hosts < 1:
            raise ValueError(f"--eval-hosts must be at least 1, got {hosts}")
        self.ray = ray = import_ray()
        self.config, self.max_restarts = config, max_restarts
        self.remote = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(EvalHost)
        state = algo.state_dict()
        self.handles = [self.remote.remote(config, state) for _ in range(hosts)]
        self.lives = [0] * hosts
        self.told: EvalResult | None = None  # the last round's result, for hosts that had it not
        self.fresh = [True] * hosts  # started from the algorithm's current state

    def restarts(self) -> int:
        """Host replacements so far."""
        return sum(self.lives)

    def step(self, algo: Algorithm, evaluator: PopulationEvaluator) -> Generation:
        """Ask, evaluate on the hosts and tell until the algorithm finishes a generation."""
        while True:
            state = algo.state_dict()  # for a host replaced during this round
            ask = algo.ask()
            episodes = np.asarray(ask.episodes)
            parts = self._round(state, shares(episodes, len(self.handles)))
            for part in parts:
                if part["seed"] != ask.seed:
                    raise RuntimeError("an evaluation host's algorithm is out of step with the run")
                for name, seconds in part["timing"].items():
                    evaluator.timing.add(name, seconds)
            returns = np.concatenate([p["returns"] for p in parts])
            lengths = np.concatenate([p["lengths"] for p in parts])
            stats = None
            if ask.obs_stats:  # summed as one machine sums them, pair by pair
                tot = np.concatenate([p["sums"] for p in parts]).sum(axis=0)
                stats = ObsStats(float(lengths.sum()), tot[0], tot[1])
            frames = sum(p["frames"] for p in parts)
            owner = np.repeat(np.arange(len(episodes), dtype=np.int64), episodes)
            result = EvalResult(returns, lengths, owner, frames, stats)
            evaluator.frames += frames
            self.told, self.fresh = result, [False] * len(self.handles)
            gen = algo.tell(result)
            if gen is not None:
                return gen

    def _round(self, state: dict[str, Any], ranges: list[tuple[int, int]]) -> list[dict[str, Any]]:
        """Every host's share of this round, replacing hosts that die until all have returned."""
        ray = self.ray
        lost = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)
        pending = {}
        for h, (lo, hi) in enumerate(ranges):
            told = None if self.fresh[h] else self.told
            pending[self.handles[h].evaluate.remote(told, lo, hi)] = h
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        out: dict[int, dict[str, Any]] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                h = pending.pop(ref)
                try:
                    out[h] = ray.get(ref)
                except lost as e:
                    pending[self._replace(h, state, ranges[h], e)] = h
            if not ready and time.monotonic() > deadline:
                raise TimeoutError(f"evaluation hosts gave no answer within {ANSWER_TIMEOUT_S} s")
        return [out[h] for h in range(len(ranges))]

    def _replace(self, h: int, state: dict[str, Any], share: tuple[int, int],
                 cause: BaseException) -> Any:  # fmt: skip
        """Replace host h, started from the round's `state`; its evaluation of `share`."""
        if self.lives[h] >= self.max_restarts:
            raise RuntimeError(
                f"evaluation host {h} failed {self.lives[h] + 1} times; last: "
                f"{type(cause).__name__}: {cause}"
            )
        self.ray.kill(self.handles[h], no_restart=True)
        self.lives[h] += 1
        self.handles[h] = self.remote.remote(self.config, state)
        return self.handles[h].evaluate.remote(None, *share)

    def close(self) -> None:
        """Stop the hosts."""
        for handle in self.handles:
            self.ray.kill(handle, no_restart=True)
