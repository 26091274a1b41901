"""The configs of `onebox pbt LEARNER`: each learner's own config plus `PopulationFields`.

A population's config is its learner's (every flag of `onebox train LEARNER` means the same,
`--total-steps` per member) with the population's settings added, so each member's trainer is
built from it as a run of that learner would be. A learner runs as a population when its
`Learner` declares `search` ranges and its trainer lives in this process; its config class here
(`PPO`, `ApeX`, ...) is made from its entry in `onebox.registry.POPULATIONS`.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any, ClassVar, Literal

from onebox import registry


@dataclasses.dataclass
class PopulationFields:
    """Population-based training (Jaderberg et al. 2017): members of one learner trained at
    once, the worst copying the best and perturbing their hyperparameters."""

    LEARNER: ClassVar[str]
    """The learner (`onebox train` name) the members run."""
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"ray"})

    population: int = 8
    """Members trained at once in this process, each with its own envs, networks and optimizer
    (at least 2); `--total-steps` is each member's."""
    ready: int | None = None
    """Env steps of each member between two exploit-and-explore rounds (default: a twentieth of
    `--total-steps`)."""
    selection: Literal["truncation", "tournament", "none"] = "truncation"
    """Who copies whom: `truncation` (each of the bottom `--quantile` copies one of the top
    `--quantile`), `tournament` (each member meets one other drawn at random and copies it if
    it scores higher), `none` (nobody: independent members, a random search over the same
    ranges)."""
    quantile: float = 0.25
    """With truncation: the share of members at the top that are copied and at the bottom that
    copy (at least one member each, at most half)."""
    resample_probability: float = 0.25
    """Chance that a copy's hyperparameter is drawn afresh from its range instead of moved by a
    `--perturb` factor."""
    perturb: tuple[float, ...] = (0.8, 1.2)
    """The factors a copy's hyperparameter is multiplied by, one drawn at random (a discount's
    1 - x is, so its horizon moves by the factor)."""
    objective_episodes: int = 10
    """The objective members are ranked by: the mean return of each member's last this many
    finished episodes since it last copied (a member with none yet sits a round out)."""
    engine: Literal["auto", "shared", "own"] = "auto"
    """How members meet their envs: `shared`, one env pool of every member's envs stepped
    together and one batched forward (the members' networks stacked) acting for all, each
    member updating on its share (PPO and A2C with feed-forward networks, discrete actions, the
    sync sampler, no --compile, no normalizers); `own`, each member its own pools and network
    calls; `auto`, shared where it fits, else own (the run's log says which and why)."""
    updates: Literal["auto", "batched", "separate"] = "auto"
    """How the members of a shared engine update (`--engine shared`): `batched`, one stacked
    forward and backward pass of every member's minibatch at once, each member stepping its
    own optimizer after it (PPO, `onebox.algos.ppo.update_together`); `separate`, each member
    its own update, `--workers` of them at once; `auto`, batched on a GPU and separate on the
    CPU, where the batched pass measured 2x slower (vmapped convolutions run grouped,
    docs/benchmarks.md). The run's log says which."""
    workers: int | None = None
    """Threads that step the members, each its share of them, all at once: a small network's
    learner keeps about one core busy, a population as many as it has workers (default: the
    physical cores, at most the population). With more than 1 the members' draws interleave on
    torch's one generator, so only `--workers 1` repeats a run's lineage exactly from its
    seed."""
    mutate: tuple[str, ...] = ()
    """Hyperparameters drawn for each member and mutated: each NAME (at the learner's declared
    range) or NAME=LOW:HIGH (default: every one the learner declares; an unknown name's error
    lists them with their ranges)."""
    ray: str | None = None
    """Run the members as Ray Tune trials under Tune's PopulationBasedTraining on the Ray
    cluster at this address (HOST:PORT, or `auto`), each trial one member with its envs and
    actors in its own process (a learner's own `--ray`, for actors, does not apply here); the
    run folder must be on storage every node reaches. Needs `pip install "onebox[ray]"`."""
    ray_restarts: int = 3
    """With `--ray`: how often a member may restart from its last checkpoint (its node lost)
    before the run fails."""


def learner_module(config: PopulationFields) -> ModuleType:
    """The module of the learner the members run."""
    return importlib.import_module(registry.LEARNERS[config.LEARNER].config.partition(":")[0])


def member_config(config: Any, member: int) -> Any:
    """Member `member`'s config: the run's with its own seed (network initialization,
    exploration) and, for a learner with actors, its actors in its own process; its envs' seeds
    come from the run's one `EnvSeeds`."""
    return dataclasses.replace(config, seed=config.seed + member, ray=None)


def population_config(learner: str, name: str) -> type:
    """The config class `name` of a population of `learner`: its learner's `Config` with
    `PopulationFields` (a class of this module, as config.json names it)."""
    module, _, attr = registry.LEARNERS[learner].config.partition(":")
    base = getattr(importlib.import_module(module), attr)
    namespace = {"__module__": __name__, "__doc__": f"Population-based training of {learner}.",
                 "LEARNER": learner}  # fmt: skip
    return dataclasses.make_dataclass(name, [], bases=(PopulationFields, base), namespace=namespace)


for _learner, _entry in registry.POPULATIONS.items():  # PPO, A2C, ..., as the registry names them
    _name = _entry.config.partition(":")[2]
    globals()[_name] = population_config(_learner, _name)
