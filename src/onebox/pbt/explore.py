"""Population-based training's decisions, apart from any trainer: which hyperparameters mutate
and within what ranges, a new member's draw, who copies whom (`pairs`), and how a copy's
hyperparameters move (`explore`). Every random choice comes from one numpy `Generator`, so a
seeded population makes the same decisions from the same scores.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from onebox.algos.trainer import Bounds, Range

Selection = Literal["truncation", "tournament", "none"]


def mutation_space(
    learner: str,
    search: Mapping[str, Range],
    tunable: Mapping[str, Bounds],
    live: Sequence[str],
    fields: Sequence[str],
    specs: Sequence[str],
) -> dict[str, Range]:
    """The hyperparameters a population of `learner` draws and mutates, with their ranges.

    `search` is the learner's declared ranges, `tunable` its tunable hyperparameters' bounds,
    `live` those this config has (a gradient clip left unset has none), `fields` its config's
    fields. `specs` (`--mutate`) are NAME (at its declared range) or NAME=LOW:HIGH; none: every
    declared one the config has. ValueError for a name that is no field, a field fixed when
    the trainer is built, a tunable one without a declared range and none given, or a bad
    range."""
    if not search:
        raise ValueError(f"{learner} declares no hyperparameters a population may mutate")
    if not specs:
        return {name: search[name] for name in search if name in live}
    space: dict[str, Range] = {}
    for spec in specs:
        name, _, text = spec.partition("=")
        name = name.strip().replace("-", "_")
        if name not in fields:
            raise ValueError(
                f"--mutate {spec}: {learner} has no hyperparameter {name!r}; it mutates "
                + ", ".join(f"{n} ({r.low:g}:{r.high:g}, {r.scale})" for n, r in search.items())
            )
        if name not in tunable:
            raise ValueError(
                f"--mutate {spec}: {name} is fixed when {learner}'s trainer is built and cannot "
                f"change while it trains; mutable: {', '.join(tunable)}"
            )
        if name not in live:
            raise ValueError(
                f"--mutate {spec}: this {learner} config turns {name} off (--{name.replace('_', '-')} "
                "unset); set it to mutate it"
            )
        if name in space:
            raise ValueError(f"--mutate names {name} twice")
        space[name] = parse_range(spec, name, text, search.get(name), tunable[name])
    return space


def parse_range(spec: str, name: str, text: str, declared: Range | None, bounds: Bounds) -> Range:
    """The range of `--mutate NAME[=LOW:HIGH]`: the declared one, or LOW:HIGH on the declared
    range's scale (linear for a hyperparameter with none declared)."""
    if not text:
        if declared is None:
            raise ValueError(f"--mutate {spec}: {name} has no declared range; give NAME=LOW:HIGH")
        return declared
    low, sep, high = text.partition(":")
    try:
        if not sep:
            raise ValueError
        bounds_ = float(low), float(high)
    except ValueError:
        raise ValueError(f"--mutate {spec}: write the range as NAME=LOW:HIGH") from None
    scale = declared.scale if declared is not None else "linear"
    rng = Range(*bounds_, scale)
    rng.check(f"--mutate {spec}: {name}", bounds)
    return rng


def draw(space: Mapping[str, Range], rng: np.random.Generator) -> dict[str, float]:
    """A new member's hyperparameters: each drawn from its range."""
    return {name: r.sample(rng) for name, r in space.items()}


@dataclasses.dataclass(frozen=True)
class Explore:
    """How a copy's hyperparameters move: each, with `resample_probability`, drawn afresh from
    its range, else multiplied by one of `factors` drawn at random (Ray Tune's and Jaderberg et
    al.'s x0.8 / x1.2)."""

    resample_probability: float = 0.25
    factors: tuple[float, ...] = (0.8, 1.2)

    def __post_init__(self) -> None:
        if not 0 <= self.resample_probability <= 1:
            raise ValueError(
                f"--resample-probability must be in [0, 1], got {self.resample_probability}"
            )
        if not self.factors or any(not math.isfinite(f) or f <= 0 for f in self.factors):
            raise ValueError(f"--perturb factors must be positive, got {self.factors}")
        if all(f == 1 for f in self.factors):
            raise ValueError("--perturb factors of 1 would never move a hyperparameter")

    def __call__(
        self, values: Mapping[str, float], space: Mapping[str, Range], rng: np.random.Generator
    ) -> dict[str, float]:
        """`values` explored: every hyperparameter of `space` moves to a different value in its
        range (a factor that the range's end stops is replaced by another that moves it)."""
        out = dict(values)
        for name, r in space.items():
            old = values[name]
            if rng.random() < self.resample_probability:
                new = r.sample(rng)
            else:
                order = rng.permutation(len(self.factors))
                moved = (r.perturb(old, self.factors[i]) for i in order)
                new = next((x for x in moved if x != old), old)
            if new == old:  # a resample that hit the same value, or no factor could move it
                new = r.sample(rng)
            out[name] = new
        return out


def pairs(
    scores: Sequence[float | None],
    selection: Selection,
    quantile: float,
    rng: np.random.Generator,
) -> list[tuple[int, int]]:
    """Who copies whom this round, as (child, parent) pairs, from each member's score (None: no
    finished episode to be ranked by; it neither copies nor is copied). `truncation`: each of
    the bottom `quantile` copies one of the top `quantile` drawn at random (at least one member
    each, at most half); `tournament`: each member meets one other drawn at random and copies
    it if its score is higher; `none`: nobody copies. A member never copies itself."""
    ranked = [i for i, s in enumerate(scores) if s is not None]
    if selection == "none" or len(ranked) < 2:
        return []
    if selection == "tournament":
        out = []
        for i in ranked:
            j = int(rng.choice([k for k in ranked if k != i]))
            if scores[j] > scores[i]:  # type: ignore[operator]
                out.append((i, j))
        return out
    order = [ranked[k] for k in rng.permutation(len(ranked))]  # ties fall at random
    order.sort(key=lambda i: scores[i], reverse=True)  # type: ignore[arg-type,return-value]
    n = min(max(1, int(len(order) * quantile)), len(order) // 2)
    top, bottom = order[:n], order[-n:]
    return [(child, int(rng.choice(top))) for child in bottom]


def check_quantile(quantile: float) -> None:
    """Raise ValueError unless truncation's `quantile` lies in (0, 0.5]."""
    if not 0 < quantile <= 0.5:
        raise ValueError(
            f"--quantile must be in (0, 0.5] (the top and bottom shares), got {quantile}"
        )
