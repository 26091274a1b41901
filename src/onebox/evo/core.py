"""What every neuroevolution algorithm shares: the ask/tell interface, noise and normalization.

An algorithm alternates `ask()` (a batch of individuals to evaluate, as an `Ask`) and
`tell(result)` (their returns). `tell` returns a `Generation` summary when a generation is complete
and None when it needs another evaluation first (the GA re-evaluates its elite candidates):

    while True:
        ask = algo.ask()
        result = evaluator.evaluate(ask.params, ask.episodes, ask.seed,
                                    obs_norm=ask.obs_norm, obs_stats=ask.obs_stats)
        if (gen := algo.tell(result)) is not None:
            break
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from onebox.evo.evaluator import EvalResult, ParamSource
from onebox.nn.noise import noise


def check_set(params: Any) -> None:
    """Raise ValueError if a field of the hyperparameter dataclass `params` is still None."""
    unset = [f.name for f in dataclasses.fields(params) if getattr(params, f.name) is None]
    if unset:
        flags = ", ".join("--" + name.replace("_", "-") for name in unset)
        raise ValueError(
            f"{type(params).__name__} leaves {flags} unset: fill it from a preset "
            "(onebox.evo.presets.PRESETS) or give every field"
        )


def perturbed(center: torch.Tensor, scale: float, seed: int, out: torch.Tensor) -> torch.Tensor:
    """`center + scale * noise(seed)`, made in `out` (on `center`'s device) by one kernel from
    the shared noise table, with no temporary vector."""
    return torch.add(center, noise(seed, center.numel(), center.device), alpha=scale, out=out)


def rows(
    idx: np.ndarray, dim: int, fill: Callable[[int, torch.Tensor], object], device: torch.device
) -> torch.Tensor:
    """A (len(idx), dim) float32 tensor on `device` whose row r `fill(idx[r], row)` writes: an
    `Ask`'s parameter function, with no per-individual vector stacked afterwards."""
    out = torch.empty(len(idx), dim, device=device)
    for i, row in zip(idx, out, strict=True):
        fill(int(i), row)
    return out


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks of `x` scaled to [-0.5, 0.5], as in OpenAI ES, equal values sharing their mean rank.

    Shared ranks matter where returns tie often (MinAtar's and Atari's small integer scores): an
    antithetic pair whose two returns tie then adds nothing to ES's gradient, where ranks broken
    by position would hand it a rank difference as large as the other tied returns between the
    two, in a direction of pure noise."""
    _, index, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # one past each distinct value's last rank, in sorted order
    ranks = (ends - (counts + 1) / 2)[index]
    return ranks / max(x.size - 1, 1) - 0.5


@dataclass
class Ask:
    """One batch of individuals for the evaluator."""

    params: ParamSource
    """(N, num_params) parameters, or a function from individual indices to their rows."""
    episodes: np.ndarray
    """(N,) episodes per individual."""
    seed: int
    """Env seed base: pair j plays with env seed `seed + j`."""
    obs_norm: tuple[np.ndarray, np.ndarray] | None = None
    """Observation (mean, std) to normalize with, or None."""
    obs_stats: bool = False
    """Whether the algorithm wants observation sums back."""


@dataclass
class Generation:
    """The summary of a finished generation."""

    generation: int
    """Index of the finished generation (0-based)."""
    fitness: np.ndarray
    """The population's fitnesses (mean return per individual)."""
    score: float
    """The algorithm's current solution's mean return (GA elite, ES/ARS center, RS best)."""
    extra: dict[str, float] = field(default_factory=dict)
    """Algorithm-specific scalars to log."""


class RunningNorm:
    """Running mean and standard deviation of observations, from evaluator `ObsStats` sums."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.count = 0.0
        self.total = np.zeros(shape, dtype=np.float64)
        self.total_sq = np.zeros(shape, dtype=np.float64)

    def update(self, stats: Any) -> None:
        """Add the sums of one evaluation."""
        self.count += stats.count
        self.total += stats.total
        self.total_sq += stats.total_sq

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std); std is floored at 0.01 and is 1 before any observation."""
        if self.count < 2:
            return np.zeros_like(self.total), np.ones_like(self.total)
        mean = self.total / self.count
        var = np.maximum(self.total_sq / self.count - mean**2, 1e-4)
        return mean, np.sqrt(var)

    def state_dict(self) -> dict[str, Any]:
        """The sums, for checkpoints."""
        return {"count": self.count, "total": self.total.copy(), "total_sq": self.total_sq.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`."""
        self.count = float(state["count"])
        self.total = np.asarray(state["total"], dtype=np.float64).copy()
        self.total_sq = np.asarray(state["total_sq"], dtype=np.float64).copy()


class Adam:
    """Adam on a flat parameter vector (ascent steps are the caller's sign)."""

    def __init__(
        self,
        dim: int,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        device: torch.device | str = "cpu",
    ) -> None:
        self.lr, self.beta1, self.beta2 = lr, beta1, beta2
        self.m = torch.zeros(dim, dtype=torch.float32, device=device)
        self.v = torch.zeros(dim, dtype=torch.float32, device=device)
        self.t = 0

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        """The update to subtract for gradient `grad`."""
        self.t += 1
        self.m.mul_(self.beta1).add_(grad, alpha=1 - self.beta1)
        self.v.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        a = self.lr * (1 - self.beta2**self.t) ** 0.5 / (1 - self.beta1**self.t)
        return a * self.m / (self.v.sqrt() + 1e-8)

    def state_dict(self) -> dict[str, Any]:
        """Moments and step count, for checkpoints (on the CPU)."""
        return {"m": self.m.cpu().clone(), "v": self.v.cpu().clone(), "t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`, on the moments' device."""
        device = self.m.device
        self.m, self.v = state["m"].to(device, copy=True), state["v"].to(device, copy=True)
        self.t = int(state["t"])


class Algorithm(abc.ABC):
    """Ask/tell neuroevolution over flat parameter vectors of `dim` numbers, made on `device`
    (the evaluator's: no parameters cross from the host); checkpoints hold CPU tensors."""

    def __init__(self, dim: int, init: Any, seed: int, device: torch.device | str = "cpu") -> None:
        self.dim = dim
        self.init = init  # seed -> a fresh individual's flat parameters, on `device`
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        self.generation = 0

    def env_seed(self) -> int:
        """A fresh env seed base for one evaluation."""
        return int(self.rng.integers(2**62))

    @abc.abstractmethod
    def ask(self) -> Ask:
        """The next batch of individuals to evaluate."""

    @abc.abstractmethod
    def tell(self, result: EvalResult) -> Generation | None:
        """Take the returns of the last `ask`; a summary when a generation is complete."""

    @abc.abstractmethod
    def best(self) -> torch.Tensor:
        """The current solution's flat parameters (on `device`)."""

    def obs_norm(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The observation normalization the solution runs with, or None."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly (subclasses add theirs)."""
        return {"generation": self.generation, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`."""
        self.generation = int(state["generation"])
        self.rng.bit_generator.state = state["rng"]
