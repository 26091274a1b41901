"""The deep GA of Such et al. (Uber, arXiv 1712.06567): truncation selection, Gaussian mutation.

Each generation: the population (the elite, unmutated, plus children) plays `episodes` episodes
each; the top `truncation` individuals become parents; the top `elite_candidates` (and the
previous elite) are re-evaluated on `elite_episodes` episodes and the best mean becomes the elite;
then P - 1 children are made, each a uniformly chosen parent plus `sigma` times Gaussian noise.

A genome is a list of seeds: the initial seed, then one seed per mutation. Its weights are
`init(seeds[0]) + sigma * noise(seeds[1]) + sigma * noise(seeds[2]) + ...`, added in that order in
float32, so they can be rebuilt bit for bit from the seeds (`rebuild`). Noise vectors are slices of
the shared noise table (`onebox.nn.noise`, as Uber's GA). Parents' weights are cached on the
evaluator's device, so a child costs one kernel there: `parent + sigma * noise(child_seed)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from onebox.evo.core import Algorithm, Ask, Generation, check_set, perturbed, rows
from onebox.evo.evaluator import EvalResult

Genome = tuple[int, ...]


@dataclass
class GAParams:
    """GA hyperparameters; `onebox evolve ga` fills those left None from the env family's preset
    (`onebox.evo.presets`: Uber's values for Atari)."""

    population: int | None = None
    """Individuals per generation (the elite included)."""
    truncation: int | None = None
    """Top individuals that become parents."""
    sigma: float | None = None
    """Mutation standard deviation."""
    episodes: int | None = None
    """Episodes per individual per generation."""
    elite_candidates: int | None = None
    """Top individuals re-evaluated to choose the elite (0: the top individual is the elite)."""
    elite_episodes: int | None = None
    """Episodes of each elite candidate's re-evaluation."""

    def check(self) -> None:
        """Raise ValueError naming the first unset or out-of-range field."""
        check_set(self)
        if self.population < 2:
            raise ValueError(f"--population must be >= 2, got {self.population}")
        if not 1 <= self.truncation <= self.population:
            raise ValueError(
                f"--truncation must be in [1, population={self.population}], got {self.truncation}"
            )
        if self.sigma <= 0:
            raise ValueError(f"--sigma must be positive, got {self.sigma}")
        if self.episodes < 1 or self.elite_episodes < 1:
            raise ValueError("--episodes and --elite-episodes must be >= 1")
        if self.elite_candidates < 0:
            raise ValueError(f"--elite-candidates must be >= 0, got {self.elite_candidates}")


def rebuild(genome: Genome, init: Callable[[int], torch.Tensor], sigma: float) -> torch.Tensor:
    """A genome's weights, from its seeds alone (on `init`'s device)."""
    theta = init(genome[0])
    for seed in genome[1:]:
        perturbed(theta, sigma, seed, theta)
    return theta


class GA(Algorithm):
    """Genetic algorithm over seed-list genomes; `init(seed)` makes a fresh individual."""

    def __init__(
        self,
        dim: int,
        init: Callable[[int], torch.Tensor],
        params: GAParams,
        seed: int,
        device: torch.device | str = "cpu",
    ) -> None:
        params.check()
        super().__init__(dim, init, seed, device)
        self.p = p = params
        self.genomes: list[Genome] = [(self._seed(),) for _ in range(p.population)]
        self.elite: Genome | None = None
        self.elite_score = float("nan")
        self.cache: dict[Genome, torch.Tensor] = {}
        self.parents: list[Genome] = []
        self.candidates: list[Genome] = []
        self.fitness = np.zeros(0)
        self.phase = "population"

    def _seed(self) -> int:
        return int(self.rng.integers(2**31))

    def weights(self, genome: Genome, out: torch.Tensor | None = None) -> torch.Tensor:
        """A genome's weights (written into `out` when given): cached, one mutation from a
        cached parent, or rebuilt."""
        parent = genome[:-1]
        if genome in self.cache:
            w = self.cache[genome]
        elif parent in self.cache:
            out = torch.empty(self.dim, device=self.device) if out is None else out
            return perturbed(self.cache[parent], self.p.sigma, genome[-1], out)
        else:
            w = rebuild(genome, self.init, self.p.sigma)
        return w if out is None else out.copy_(w)

    def _source(self, genomes: list[Genome]) -> Callable[[np.ndarray], torch.Tensor]:
        return lambda idx: rows(
            idx, self.dim, lambda i, row: self.weights(genomes[i], row), self.device
        )

    def ask(self) -> Ask:
        """The population, or (after it was told) the elite candidates."""
        if self.phase == "population":
            n, genomes, eps = len(self.genomes), self.genomes, self.p.episodes
        else:
            n, genomes, eps = len(self.candidates), self.candidates, self.p.elite_episodes
        return Ask(self._source(genomes), np.full(n, eps, dtype=np.int64), self.env_seed())

    def tell(self, result: EvalResult) -> Generation | None:
        """Select parents and elite candidates; after their re-evaluation, breed."""
        p = self.p
        if self.phase == "population":
            self.fitness = result.fitness()
            order = np.argsort(-self.fitness, kind="stable")
            self.parents = [self.genomes[i] for i in order[: p.truncation]]
            top = [self.genomes[i] for i in order[: p.elite_candidates]]
            if self.elite is not None and self.elite not in top and p.elite_candidates:
                top.append(self.elite)
            if top:
                self.candidates, self.phase = top, "elite"
                return None
            self.elite, self.elite_score = self.parents[0], float(self.fitness[order[0]])
        else:
            scores = result.fitness()
            best = int(np.argmax(scores))
            self.elite, self.elite_score = self.candidates[best], float(scores[best])
        return self._breed()

    def _breed(self) -> Generation:
        cache = {g: self.weights(g) for g in [*self.parents, self.elite]}
        self.cache = cache
        children = [
            (*self.parents[int(self.rng.integers(len(self.parents)))], self._seed())
            for _ in range(self.p.population - 1)
        ]
        self.genomes = [self.elite, *children]
        self.phase = "population"
        self.candidates = []
        gen = Generation(self.generation, self.fitness, self.elite_score)
        self.generation += 1
        return gen

    def best(self) -> torch.Tensor:
        """The elite's weights (the best of generation 0 before any generation ends)."""
        if self.elite is None:
            return self.weights(self.genomes[0])
        return self.weights(self.elite)

    def state_dict(self) -> dict[str, Any]:
        """Genomes, elite, phase and RNG (parent weights are rebuilt from their seeds)."""
        state = super().state_dict()
        state.update(
            genomes=list(self.genomes),
            elite=self.elite,
            elite_score=self.elite_score,
            parents=list(self.parents),
            candidates=list(self.candidates),
            fitness=self.fitness.copy(),
            phase=self.phase,
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`; the parent cache is rebuilt from the seeds, bit for bit."""
        super().load_state_dict(state)
        self.genomes = [tuple(g) for g in state["genomes"]]
        self.elite = tuple(state["elite"]) if state["elite"] is not None else None
        self.elite_score = float(state["elite_score"])
        self.parents = [tuple(g) for g in state["parents"]]
        self.candidates = [tuple(g) for g in state["candidates"]]
        self.fitness = np.asarray(state["fitness"])
        self.phase = state["phase"]
        keep = [*self.parents, self.elite] if self.elite is not None else []
        self.cache = {g: rebuild(g, self.init, self.p.sigma) for g in keep}
