"""Random search: pure random sampling (Uber's baseline) and ARS (Mania et al., arXiv 1803.07055).

`mode="random"`: every generation samples `population` fresh networks; the best seen so far is the
solution (its score is the mean return it got).

`mode="ars"`: a center perturbed by antithetic directions `theta +- sigma * delta_k`; the top
`top_directions` directions by max(r+, r-) move it by
`lr / (b * sigma_R) * sum_k (r+_k - r-_k) delta_k`, with sigma_R the standard deviation of those
2b returns (ARS V2-t), with running observation normalization. A linear policy's center starts at
zero, as the paper's (M_0 = 0); a network with hidden layers starts from a fresh network.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from onebox.evo.core import Algorithm, Ask, Generation, check_set, rows
from onebox.evo.es import Antithetic, check_antithetic
from onebox.evo.evaluator import EvalResult


@dataclass
class RSParams:
    """Random-search hyperparameters; `onebox evolve rs` fills those left None from the env
    family's preset (`onebox.evo.presets`: ARS V2-t with a linear policy for MuJoCo)."""

    mode: Literal["random", "ars"] = "ars"
    """'random': sample fresh networks, keep the best; 'ars': augmented random search."""
    population: int | None = None
    """Individuals per generation (ars: an even number, 2 per direction)."""
    sigma: float | None = None
    """ars: perturbation standard deviation."""
    lr: float | None = None
    """ars: step size."""
    top_directions: int | None = None
    """ars: directions used per update (b)."""
    episodes: int | None = None
    """Episodes per individual."""
    center_episodes: int | None = None
    """ars: episodes of the center per generation (its mean is the reported score)."""
    obs_norm: bool | None = None
    """ars: normalize observations with running statistics."""

    def check(self) -> None:
        """Raise ValueError naming the first unset or out-of-range field."""
        check_set(self)
        if self.mode == "random":
            if self.population < 1 or self.episodes < 1:
                raise ValueError("random search needs --population >= 1 and --episodes >= 1")
            return
        check_antithetic(self.population, self.sigma, self.episodes, self.center_episodes)
        if self.lr <= 0:
            raise ValueError(f"--lr must be positive, got {self.lr}")
        if not 1 <= self.top_directions <= self.population // 2:
            raise ValueError(
                f"--top-directions must be in [1, population / 2 = {self.population // 2}] "
                f"(ars: 2 individuals per direction), got {self.top_directions}"
            )


class ARS(Antithetic):
    """Augmented random search (V2-t); `linear`: the policy is linear, its center starts at 0."""

    p: RSParams

    def __init__(
        self,
        dim: int,
        init: Callable[[int], torch.Tensor],
        params: RSParams,
        seed: int,
        obs_shape: tuple[int, ...] | None = None,
        device: torch.device | str = "cpu",
        linear: bool = False,
    ) -> None:
        super().__init__(dim, init, params, seed, obs_shape, device)
        if linear:
            self.theta.zero_()

    def update(self, plus: np.ndarray, minus: np.ndarray) -> dict[str, float]:
        """Step along the top directions, scaled by the spread of their returns."""
        b = self.p.top_directions
        top = np.argsort(-np.maximum(plus, minus), kind="stable")[:b]
        sigma_r = float(np.concatenate([plus[top], minus[top]]).std()) or 1.0
        step = self.weighted_noise(plus - minus, keep=top) * (self.p.lr / (b * sigma_r))
        self.theta = self.theta + step
        return {"ars/return_std": sigma_r, "ars/step_norm": float(step.norm())}


class RandomSearch(Algorithm):
    """Samples fresh networks each generation and keeps the best seen."""

    def __init__(
        self,
        dim: int,
        init: Callable[[int], torch.Tensor],
        params: RSParams,
        seed: int,
        device: torch.device | str = "cpu",
    ) -> None:
        params.check()
        super().__init__(dim, init, seed, device)
        self.p = params
        self.seeds = np.zeros(0, dtype=np.int64)
        self.best_seed: int | None = None
        self.score = float("-inf")

    def ask(self) -> Ask:
        """`population` fresh networks."""
        self.seeds = self.rng.integers(2**31, size=self.p.population)
        return Ask(
            lambda idx: rows(
                idx, self.dim, lambda i, row: row.copy_(self.init(int(self.seeds[i]))), self.device
            ),
            np.full(self.p.population, self.p.episodes, dtype=np.int64),
            self.env_seed(),
        )

    def tell(self, result: EvalResult) -> Generation:
        """Keep the best network seen so far."""
        fitness = result.fitness()
        i = int(np.argmax(fitness))
        if fitness[i] > self.score:
            self.score, self.best_seed = float(fitness[i]), int(self.seeds[i])
        gen = Generation(self.generation, fitness, self.score)
        self.generation += 1
        return gen

    def best(self) -> torch.Tensor:
        """The best network seen (a fresh one before any generation)."""
        return self.init(self.best_seed if self.best_seed is not None else 0)

    def state_dict(self) -> dict[str, Any]:
        """Best seed and score, RNG."""
        return {**super().state_dict(), "best_seed": self.best_seed, "score": self.score}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`."""
        super().load_state_dict(state)
        self.best_seed, self.score = state["best_seed"], float(state["score"])
