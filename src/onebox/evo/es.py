"""OpenAI-style evolution strategies (Salimans et al., arXiv 1703.03864).

A center `theta` is perturbed by antithetic pairs `theta +- sigma * eps_k` (eps_k from seeds:
slices of the shared noise table, `onebox.nn.noise`, so only seeds travel); returns are turned
into centered ranks; the gradient estimate `sum_k (r+_k - r-_k) eps_k / P` drives Adam with
weight decay. Observations are normalized with running statistics gathered during evaluation. The
center itself plays `center_episodes` episodes each generation: its mean return is the reported
score.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from onebox.evo.core import (
    Adam,
    Algorithm,
    Ask,
    Generation,
    RunningNorm,
    centered_ranks,
    check_set,
    perturbed,
    rows,
)
from onebox.evo.evaluator import EvalResult


@dataclass
class ESParams:
    """ES hyperparameters; `onebox evolve es` fills those left None from the env family's preset
    (`onebox.evo.presets`: OpenAI's values for Atari and MuJoCo)."""

    population: int | None = None
    """Perturbed individuals per generation (an even number: antithetic pairs)."""
    sigma: float | None = None
    """Perturbation standard deviation."""
    lr: float | None = None
    """Adam step size."""
    weight_decay: float | None = None
    """L2 coefficient added to the (ascent) gradient."""
    episodes: int | None = None
    """Episodes per perturbed individual."""
    center_episodes: int | None = None
    """Episodes of the center per generation (its mean is the reported score; 0: none)."""
    obs_norm: bool | None = None
    """Normalize observations with running statistics."""

    def check(self) -> None:
        """Raise ValueError naming the first unset or out-of-range field."""
        check_set(self)
        check_antithetic(self.population, self.sigma, self.episodes, self.center_episodes)
        if self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(f"--lr must be positive and --weight-decay >= 0, got {self.lr}, "
                             f"{self.weight_decay}")  # fmt: skip


def check_antithetic(population: int, sigma: float, episodes: int, center_episodes: int) -> None:
    """Raise ValueError unless the settings every antithetic method shares are in range."""
    if population < 2 or population % 2:
        raise ValueError(
            f"--population must be an even number >= 2 (antithetic pairs), got {population}"
        )
    if sigma <= 0:
        raise ValueError(f"--sigma must be positive, got {sigma}")
    if episodes < 1 or center_episodes < 0:
        raise ValueError("--episodes must be >= 1 and --center-episodes >= 0")


class AntitheticParams(Protocol):
    """The settings every antithetic method has (`ESParams`, `RSParams`); `check` raises
    ValueError for an unset or out-of-range one."""

    population: int | None
    sigma: float | None
    episodes: int | None
    center_episodes: int | None
    obs_norm: bool | None

    def check(self) -> None: ...


class Antithetic(Algorithm):
    """A center perturbed by antithetic noise pairs; subclasses turn returns into updates."""

    def __init__(
        self,
        dim: int,
        init: Callable[[int], torch.Tensor],
        params: AntitheticParams,
        seed: int,
        obs_shape: tuple[int, ...] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        """`obs_shape`: the observations' shape, to normalize them (with `params.obs_norm`)."""
        params.check()
        super().__init__(dim, init, seed, device)
        self.p = params
        self.population, self.sigma = int(params.population), float(params.sigma)
        self.episodes, self.center_episodes = int(params.episodes), int(params.center_episodes)
        self.theta = init(int(self.rng.integers(2**31)))
        normalize = params.obs_norm and obs_shape is not None
        self.norm = RunningNorm(obs_shape) if normalize else None
        self.seeds = np.zeros(0, dtype=np.int64)
        self.score = float("nan")

    def _member(self, i: int, out: torch.Tensor) -> torch.Tensor:
        if i >= self.population:
            return out.copy_(self.theta)
        sign = 1.0 if i % 2 == 0 else -1.0
        return perturbed(self.theta, sign * self.sigma, int(self.seeds[i // 2]), out)

    def ask(self) -> Ask:
        """Pairs theta + sigma eps_k (even index), theta - sigma eps_k (odd), then the center."""
        self.seeds = self.rng.integers(2**31, size=self.population // 2)
        eps = np.full(self.population + (self.center_episodes > 0), self.episodes, dtype=np.int64)
        if self.center_episodes:
            eps[-1] = self.center_episodes
        return Ask(
            lambda idx: rows(idx, self.dim, self._member, self.device),
            eps,
            self.env_seed(),
            obs_norm=self.obs_norm(),
            obs_stats=self.norm is not None,
        )

    def tell(self, result: EvalResult) -> Generation:
        """Update the center from the pairs' returns."""
        fitness = result.fitness()
        pop = fitness[: self.population]
        self.score = float(fitness[-1]) if self.center_episodes else float(pop.max())
        extra = self.update(pop[0::2], pop[1::2])
        if self.norm is not None and result.obs_stats is not None:
            self.norm.update(result.obs_stats)
        gen = Generation(self.generation, pop, self.score, extra)
        self.generation += 1
        return gen

    @abc.abstractmethod
    def update(self, plus: np.ndarray, minus: np.ndarray) -> dict[str, float]:
        """Move `theta` given the returns of theta + sigma eps_k and theta - sigma eps_k."""

    def weighted_noise(self, weights: np.ndarray, keep: np.ndarray | None = None) -> torch.Tensor:
        """sum_k weights[k] * eps_k over the pairs `keep` (default: all)."""
        total = torch.zeros(self.dim, device=self.device)
        for k in range(len(self.seeds)) if keep is None else keep:
            perturbed(total, float(weights[k]), int(self.seeds[k]), total)  # += w_k eps_k
        return total

    def best(self) -> torch.Tensor:
        """The center."""
        return self.theta

    def obs_norm(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The running observation (mean, std), if normalizing."""
        return self.norm.mean_std() if self.norm is not None else None

    def state_dict(self) -> dict[str, Any]:
        """Center, normalizer, pending seeds and RNG."""
        state = super().state_dict()
        state.update(theta=self.theta.cpu().clone(), seeds=self.seeds.copy(), score=self.score)
        state["norm"] = self.norm.state_dict() if self.norm is not None else None
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`."""
        super().load_state_dict(state)
        self.theta = state["theta"].to(self.device, copy=True)
        self.seeds = np.asarray(state["seeds"])
        self.score = float(state["score"])
        if self.norm is not None:
            self.norm.load_state_dict(state["norm"])


class ES(Antithetic):
    """OpenAI ES: centered ranks, Adam, weight decay, observation normalization."""

    p: ESParams

    def __init__(
        self,
        dim: int,
        init: Callable[[int], torch.Tensor],
        params: ESParams,
        seed: int,
        obs_shape: tuple[int, ...] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(dim, init, params, seed, obs_shape, device)
        self.adam = Adam(dim, params.lr, device=self.device)

    def update(self, plus: np.ndarray, minus: np.ndarray) -> dict[str, float]:
        """One Adam step along the rank-weighted noise."""
        ranks = centered_ranks(np.concatenate([plus, minus]))
        n = len(plus)
        grad = self.weighted_noise(ranks[:n] - ranks[n:]) / self.population
        step = self.adam.step(-grad + self.p.weight_decay * self.theta)
        self.theta = self.theta - step
        return {
            "es/grad_norm": float(grad.norm()),
            "es/theta_norm": float(self.theta.norm()),
        }

    def state_dict(self) -> dict[str, Any]:
        """Adds the Adam moments."""
        return {**super().state_dict(), "adam": self.adam.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`."""
        super().load_state_dict(state)
        self.adam.load_state_dict(state["adam"])
