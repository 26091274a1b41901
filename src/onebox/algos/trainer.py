"""The learner contract: what every learner is to the driver (`onebox.algos.driver`) and to
anything that runs learners as objects (a population of them, a test).

A learner is two parts, after Acme's builders and Ray Tune's Trainable:

- its `Learner` (one per algorithm, in its own module): the networks and optimizers, the policy
  the actors act with (named outputs), the update on what feeds it (which writes its own replay
  priorities back), its state, and its tunable hyperparameters (`Hyperparams`): live values the
  update reads each time, so that a value set between two updates is the one the next uses;
- its `Trainer` (one per family of learners: `onpolicy.OnPolicyTrainer` around the sampler,
  `offpolicy.ReplayTrainer` around one inline actor and a replay buffer,
  `actor_learner.ActorLearnerTrainer` around actors, inference and a channel,
  `a3c.HogwildTrainer` around Hogwild workers): what feeds the learner. `step()` runs one
  iteration of its family's work and returns its stats and finished episodes; `state_dict` /
  `load_state_dict` give its whole state; `hp` its hyperparameters.

Every env a trainer makes is seeded from an `EnvSeeds`: the run's seed plus the count of env
seeds handed out before, so that envs made on resume, or for a restarted worker, never replay
an earlier episode's seed.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from onebox.nn.accel import Accel
from onebox.run.timing import TimeSplit

# ---- hyperparameters ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The values a tunable hyperparameter may take: `low` <= x <= `high`, or `low` < x where
    `open_low` (a learning rate must stay above 0)."""

    low: float = 0.0
    high: float = math.inf
    open_low: bool = False

    def check(self, name: str, value: float) -> None:
        """Raise ValueError unless `value` lies within the bounds."""
        below = value <= self.low if self.open_low else value < self.low
        if not math.isfinite(value) or below or value > self.high:
            left = "(" if self.open_low else "["
            right = "]" if math.isfinite(self.high) else ")"
            raise ValueError(
                f"{name} must be in {left}{self.low:g}, {self.high:g}{right}, got {value}"
            )


POSITIVE = Bounds(open_low=True)
"""x > 0: learning rates, clip ranges, gradient norm clips."""
NONNEGATIVE = Bounds()
"""x >= 0: loss coefficients."""
UNIT = Bounds(high=1.0)
"""0 <= x <= 1: discounts and lambdas."""
RATE = Bounds(high=1.0, open_low=True)
"""0 < x <= 1: Polyak rates (1: a copy)."""


@dataclasses.dataclass(frozen=True)
class Linear:
    """A schedule: the factor a hyperparameter's base value is multiplied by at the run's
    progress p (0 at its start, 1 at its end), moving linearly from `start` to `end`."""

    start: float = 1.0
    end: float = 0.0

    def __call__(self, progress: float) -> float:
        return self.start + (self.end - self.start) * progress


def tunables(**bounds: Bounds) -> Mapping[str, Bounds]:
    """A learner's `tunable` declaration, read-only: each hyperparameter's name and bounds."""
    return MappingProxyType(bounds)


@dataclasses.dataclass(frozen=True)
class Range:
    """Where population-based training (`onebox.pbt`) draws and moves a hyperparameter:
    `low` <= x <= `high`, on `scale` "linear" (uniform), "log" (log-uniform: learning rates,
    coefficients spanning decades) or "complement" (1 - x log-uniform: discounts and lambdas,
    whose horizon 1 / (1 - x) is what matters)."""

    low: float
    high: float
    scale: Literal["linear", "log", "complement"] = "linear"

    def check(self, name: str, bounds: Bounds) -> None:
        """Raise ValueError unless the range is non-empty, upright and inside `bounds`."""
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(
                f"the range of {name} must have low < high (both finite), got "
                f"{self.low:g}:{self.high:g}"
            )
        bounds.check(f"{name}'s low end", self.low)
        bounds.check(f"{name}'s high end", self.high)
        if self.scale == "log" and self.low <= 0:
            raise ValueError(f"{name} is drawn log-uniformly: its range must be above 0")
        if self.scale == "complement" and self.high >= 1:
            raise ValueError(f"{name} is drawn as 1 - x log-uniformly: its range must be below 1")

    def _to(self, x: float) -> float:
        if self.scale == "log":
            return math.log(x)
        return math.log(1 - x) if self.scale == "complement" else x

    def _from(self, y: float) -> float:
        if self.scale == "log":
            return math.exp(y)
        return 1 - math.exp(y) if self.scale == "complement" else y

    def sample(self, rng: np.random.Generator) -> float:
        """A value drawn uniformly on the range's scale."""
        a, b = sorted((self._to(self.low), self._to(self.high)))
        return min(self.high, max(self.low, self._from(float(rng.uniform(a, b)))))

    def perturb(self, x: float, factor: float) -> float:
        """`x` moved by `factor` (x * factor; for "complement" 1 - (1 - x) * factor), kept in
        the range."""
        moved = 1 - (1 - x) * factor if self.scale == "complement" else x * factor
        return min(self.high, max(self.low, moved))


def ranges(**search: Range) -> Mapping[str, Range]:
    """A learner's `search` declaration, read-only: the range of each hyperparameter a
    population may mutate."""
    return MappingProxyType(search)


LEARNING_RATE = Range(1e-5, 1e-2, "log")
"""The search range of a learning rate."""
DISCOUNT = Range(0.9, 0.999, "complement")
"""The search range of a discount (horizons of 10 to 1,000 steps)."""
GRAD_CLIP = Range(0.1, 10.0, "log")
"""The search range of a gradient norm clip."""


ANNEAL = Linear()
"""`--anneal-lr`: the factor falls linearly from 1 to 0 over the run."""


class Hyperparams:
    """A learner's tunable hyperparameters as live values.

    Each has a base value (the config's, until `set` changes it) and, when the driver gave it a
    schedule, a factor of the run's `progress`: `hp.learning_rate` is base x schedule(progress).
    The learner reads them at each update; optimizers bound to a learning rate (`bind`) get its
    value whenever it changes, so `optimizer.param_groups` always hold the current rate. The
    values live in one float64 tensor, which A3C's worker processes share (`share_memory`): a
    worker calls `apply` before each update to load the rates into its own view of the shared
    optimizer. They are read and written through a numpy view of it (an element of a tensor
    costs microseconds, and DQN's driver sets the progress at every env step)."""

    def __init__(self, learner: str, tunable: Mapping[str, Bounds], values: Mapping[str, float]):
        self.learner, self.bounds = learner, dict(tunable)
        self._index = {name: i for i, name in enumerate(self.bounds)}
        for name, value in values.items():
            self.bounds[name].check(f"--{name.replace('_', '-')}", float(value))
        self._values = torch.tensor([float(values[n]) for n in self.bounds] + [0.0],
                                    dtype=torch.float64)  # fmt: skip
        self._array = self._values.numpy()
        self._schedules: dict[str, Linear] = {}
        self._optimizers: dict[str, list[torch.optim.Optimizer]] = {}

    @property
    def names(self) -> tuple[str, ...]:
        """The tunable hyperparameters, in the learner's order."""
        return tuple(self.bounds)

    def __getattr__(self, name: str) -> float:
        index = self.__dict__.get("_index", {})
        if name not in index:
            raise AttributeError(
                f"{self.__dict__.get('learner', '?')} has no hyperparameter {name!r}"
            )
        value = float(self._array[index[name]])
        schedule = self._schedules.get(name)
        return value if schedule is None else value * schedule(self.progress)

    def _check_names(self, names: Iterable[str], what: str) -> None:
        unknown = [n for n in names if n not in self._index]
        if unknown:
            raise ValueError(
                f"{self.learner} cannot {what} {', '.join(unknown)}: its tunable "
                f"hyperparameters are {', '.join(self.names) or 'none'}"
            )

    def values(self) -> dict[str, float]:
        """Every hyperparameter's current value (scheduled ones at the current progress)."""
        return {name: getattr(self, name) for name in self.names}

    def base(self) -> dict[str, float]:
        """Every hyperparameter's base value (before its schedule)."""
        return {name: float(self._array[i]) for name, i in self._index.items()}

    def set(self, **values: float) -> None:
        """Change base values; the next update uses them. ValueError for a name the learner
        does not have or a value out of its bounds (nothing changes then)."""
        self._check_names(values, "set")
        for name, value in values.items():
            self.bounds[name].check(name, float(value))
        for name, value in values.items():
            self._array[self._index[name]] = float(value)
        self.apply()

    @property
    def progress(self) -> float:
        """The run's progress, 0 to 1, at which schedules are read (set by the driver)."""
        return float(self._array[-1])

    @progress.setter
    def progress(self, value: float) -> None:
        self._array[-1] = min(1.0, max(0.0, value))
        if self._schedules:
            self.apply()

    @property
    def scheduled(self) -> bool:
        """Whether any hyperparameter follows a schedule (else `progress` changes nothing)."""
        return bool(self._schedules)

    def schedule(self, name: str, schedule: Linear) -> None:
        """Multiply `name`'s base value by `schedule(progress)` from now on; ValueError if the
        learner has no such hyperparameter (a schedule it cannot follow)."""
        self._check_names([name], "schedule")
        self._schedules[name] = schedule
        self.apply()

    def bind(self, name: str, *optimizers: torch.optim.Optimizer) -> None:
        """Keep the learning rate of every param group of `optimizers` equal to `name`."""
        self._check_names([name], "bind")
        self._optimizers.setdefault(name, []).extend(optimizers)
        self.apply()

    def apply(self) -> None:
        """Write the bound learning rates into their optimizers."""
        for name, optimizers in self._optimizers.items():
            value = getattr(self, name)
            for optimizer in optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = value

    def share_memory(self) -> Hyperparams:
        """Move the values to shared memory (A3C's workers read them there); returns self."""
        self._values.share_memory_()  # a new allocation: the view follows it
        self._array = self._values.numpy()
        return self

    def __getstate__(self) -> dict[str, Any]:  # optimizers stay with their process
        return {k: v for k, v in self.__dict__.items() if k != "_array"} | {"_optimizers": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._array = self._values.numpy()

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.set(**state["base"])


# ---- env seeds --------------------------------------------------------------------------------


class EnvSeeds:
    """The one rule for seeding envs: the run's seed plus the count of env seeds handed out so
    far. A new run's first pools start at the run's seed (env i of n seeded seed + i, as a pool
    of n seeds them); a resumed run's, and a restarted worker's, go on from where the count
    stood, so no env of a run starts an episode with a seed an earlier one used."""

    def __init__(self, seed: int, used: int = 0) -> None:
        self.seed, self.used = seed, used

    def take(self, n: int) -> int:
        """The first of `n` fresh seeds (seed, seed + 1, ..., seed + n - 1 are the caller's)."""
        first = self.seed + self.used
        self.used += n
        return first


# ---- the learner and the trainer --------------------------------------------------------------


class Learner(abc.ABC):
    """One algorithm (see the module's docstring). A subclass sets `tunable` (its
    hyperparameters and their bounds), `learning_rates` (those `--anneal-lr` anneals), `search`
    (those a population may mutate, a subset of `tunable`, and their ranges; none: the learner
    runs no population) and, in its constructor, `hp` (`make_hyperparams`), binding each
    learning rate to its optimizers."""

    tunable: ClassVar[Mapping[str, Bounds]] = MappingProxyType({})
    search: ClassVar[Mapping[str, Range]] = MappingProxyType({})
    learning_rates: ClassVar[tuple[str, ...]] = ("learning_rate",)
    hp: Hyperparams
    updating: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    """What an update wraps its weight change in: the actor-learner trainer sets the inference
    server's `updating` (inference waits, the weights' version moves on)."""
    accel: Accel | None = None
    """The run's precision and compilation (`--precision`, `--compile`), where the learner's
    config has them."""
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    """A learner with one optimizer: it and the parameters it steps, listed once (`descend`)."""

    def descend(self, loss: torch.Tensor, max_grad_norm: float | None) -> None:
        """One step of `optimizer` down `loss`: the gradients of `params`, their norm clipped to
        `max_grad_norm` (None: not clipped), the step inside `updating()`."""
        self.optimizer.zero_grad()
        loss.backward()
        self.apply_gradients(max_grad_norm)

    def apply_gradients(self, max_grad_norm: float | None) -> None:
        """`optimizer`'s step on the gradients `params` hold, their norm clipped to
        `max_grad_norm` (None: not clipped), inside `updating()`."""
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, max_grad_norm)
        with self.updating():
            self.optimizer.step()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The run's precision around an update (bfloat16 autocast for `--precision bf16`)."""
        return self.accel.autocast() if self.accel is not None else contextlib.nullcontext()

    def make_hyperparams(self, config: Any, names: Iterable[str] | None = None) -> Hyperparams:
        """`Hyperparams` of `names` (default: every `tunable` one) with the config's values,
        leaving out those the config turns off (None: no gradient clipping, say); ValueError
        naming the flag if a value is out of its bounds."""
        values = {name: getattr(config, name) for name in (names or self.tunable)}
        values = {name: value for name, value in values.items() if value is not None}
        tunable = {name: self.tunable[name] for name in values}
        return Hyperparams(type(self).__module__.rsplit(".", 1)[-1], tunable, values)

    def notes(self) -> list[str]:
        """Lines for the run's log at its start (what a setting does)."""
        return []

    @abc.abstractmethod
    def update(self, batch: Any) -> dict[str, float]:
        """One update on what the learner's feed gave (a rollout, unrolls, a replay batch);
        returns the stats to log."""

    @abc.abstractmethod
    def greedy(self, device: torch.device) -> Callable[[Any, Any], Any]:
        """The policy `onebox eval` plays: `policy(obs, starts) -> actions` for a batch of
        envs (`starts` flags observations that begin an episode, for recurrent policies)."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers and the learner's own counters (plain data)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclasses.dataclass
class Step:
    """What one trainer step did: the stats of its update (empty when it made none) and the
    episodes that finished during it."""

    stats: dict[str, float]
    returns: list[float]
    lengths: list[int]


class Trainer(abc.ABC):
    """A learner with what feeds it: one run's work as an object (see the module's docstring).

    A subclass calls `super().__init__()`, sets `learner`, `total_steps` and the counters
    `global_step` (env steps that reached the learner) and `updates`, and implements `step`. The
    driver constructs it (envs and networks made, nothing started: bad input raises before the
    run folder exists), loads a checkpoint's state into it, then `with trainer:` (actors and
    workers started, all stopped on leaving) steps it until `done` and calls `finish`."""

    def __init__(self) -> None:
        self.timer = TimeSplit()
        """Where the trainer's wall time goes (`env`, `inference`, `learn`, ...)."""

    learner: Learner
    global_step: int = 0
    updates: int = 0
    total_steps: int
    """Env steps at which the run ends."""
    num_envs: int
    """The envs the trainer steps (all its actors' together)."""
    replay: Any = None
    """The replay table (`save(path)`, `resume_from(path)`) the driver saves with checkpoints
    when the config's `save_replay` asks, else None."""

    @property
    def hp(self) -> Hyperparams:
        """The learner's live hyperparameters."""
        return self.learner.hp

    @property
    def done(self) -> bool:
        return self.global_step >= self.total_steps

    @abc.abstractmethod
    def step(self) -> Step:
        """One iteration of the family's work: env steps, and an update when one is due."""

    def charts(self) -> dict[str, float]:
        """Scalars of the trainer's own parts since the last call (the inference server's and
        the actors' time, restarts), logged with the stats."""
        return {}

    def notes(self) -> list[str]:
        """Lines for the run's log at its start: the learner's, and where a trainer runs its
        actors."""
        return self.learner.notes()

    def interrupted(self) -> bool:
        """Whether the run was asked to stop: a step waiting for data returns early then (the
        driver puts the run session's Ctrl-C flag here)."""
        return False

    def refill(self) -> str:
        """A resumed run lost its replay table (not saved): learn again once it holds
        `learning_starts` items; returns what it waits for, for the run's log."""
        raise NotImplementedError(f"{type(self).__name__} has no replay to refill")

    def finish(self) -> Step:
        """After the last step: stop producing and return what finished meanwhile (A3C's
        workers' last reports); the counters are then final."""
        return Step({}, [], [])

    @abc.abstractmethod
    def start(self) -> None:
        """Reset the envs and start what runs beside the driver's thread (actors, workers)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop and release everything (idempotent)."""

    def __enter__(self) -> Trainer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """The whole state: the learner's, its hyperparameters' base values and the counters."""
        return {"learner": self.learner.state_dict(), "hyperparams": self.hp.state_dict(),
                "global_step": self.global_step, "updates": self.updates}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a `state_dict`, copied first: an optimizer's `load_state_dict` keeps the tensors
        it is given (its moments), which must not stay shared with the trainer they came from.
        The hyperparameters load after the learner: they set the optimizers' rates (which the
        optimizers' own state brought back as they were saved)."""
        state = copy.deepcopy(state)
        self.learner.load_state_dict(state["learner"])
        self.hp.load_state_dict(state["hyperparams"])
        self.global_step, self.updates = int(state["global_step"]), int(state["updates"])
