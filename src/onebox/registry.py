"""The learners of `onebox train` and the algorithms of `onebox evolve`: each command's name, its
config class (as "module:Name", imported only when the command runs) and its one-line help.

The command line (`onebox.cli`) builds its `train` and `evolve` commands from these tables, and
`command_of` reads from them which command made a run folder, for the library's `--resume` and
`onebox eval` (which must not import the command line). A new learner or algorithm is one entry
here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Entry:
    """One `onebox train` learner or `onebox evolve` algorithm."""

    help: str
    """One line shown in its group's `--help`."""
    config: str
    """Its config dataclass, as "module:Name"; a run folder's `config.json` names it."""


LEARNERS: dict[str, Entry] = {
    "ppo": Entry("PPO with CleanRL's defaults per env family.", "onebox.algos.ppo:Config"),
    "impala": Entry(
        "IMPALA: actor threads, central batched inference, V-trace learner.",
        "onebox.algos.impala:Config",
    ),
    "appo": Entry(
        "APPO: IMPALA's actors and inference, PPO's clipped loss on V-trace targets.",
        "onebox.algos.appo:Config",
    ),
    "apex": Entry(
        "Ape-X DQN: actors with their own epsilons, central inference, prioritized replay.",
        "onebox.algos.apex:Config",
    ),
    "r2d2": Entry(
        "R2D2: Ape-X with an LSTM Q-network trained on stored sequences with burn-in.",
        "onebox.algos.r2d2:Config",
    ),
    "a2c": Entry(
        "A2C (synchronous advantage actor-critic) with Stable-Baselines3's defaults.",
        "onebox.algos.a2c:Config",
    ),
    "a3c": Entry(
        "A3C: Hogwild worker processes (--actors N) updating one shared model.",
        "onebox.algos.a3c:Config",
    ),
    "dqn": Entry(
        "DQN (double, dueling, n-step, prioritized options) with CleanRL's defaults.",
        "onebox.algos.dqn:Config",
    ),
    "pqn": Entry(
        "PQN: parallel Q(lambda) with layer norm, no replay, no target network.",
        "onebox.algos.pqn:Config",
    ),
    "sac": Entry("SAC for continuous actions with CleanRL's defaults.", "onebox.algos.sac:Config"),
}
"""The learners of `onebox train`, in the order of its `--help`."""

ALGORITHMS: dict[str, Entry] = {
    "ga": Entry(
        "Deep GA (Uber): truncation selection, elitism, Gaussian mutation.",
        "onebox.evo.run:GAConfig",
    ),
    "es": Entry("OpenAI ES: antithetic pairs, centered ranks, Adam.", "onebox.evo.run:ESConfig"),
    "rs": Entry("Random search: fresh random networks or ARS.", "onebox.evo.run:RSConfig"),
}
"""The algorithms of `onebox evolve`, in the order of its `--help`."""

POPULATIONS: dict[str, Entry] = {
    name: Entry(f"A population of {name} members (population-based training).",
                f"onebox.pbt.configs:{cls}")
    for name, cls in (("ppo", "PPO"), ("a2c", "A2C"), ("pqn", "PQN"), ("dqn", "DQN"),
                      ("sac", "SAC"), ("impala", "IMPALA"), ("appo", "APPO"), ("apex", "ApeX"),
                      ("r2d2", "R2D2"))
}  # fmt: skip
"""The learners of `onebox pbt`: those whose learner declares `search` ranges and whose trainer
runs in this process."""

NO_POPULATION: dict[str, str] = {
    "a3c": "A3C's Hogwild workers are processes that each step their own envs and update one "
    "shared model, so its members could not share this process; use a2c",
}
"""The learners `onebox pbt` refuses, and why."""


def command_of(run_dir: str | Path) -> tuple[str, str]:
    """The command that made the run in `run_dir`, as ("train", "evolve" or "pbt", its name),
    from the config type its `config.json` names (nothing is imported for this); ValueError if
    none did."""
    from onebox.run.folder import config_type  # not at import: `onebox --help` stays fast

    target = config_type(Path(run_dir))
    for group, entries in (("train", LEARNERS), ("evolve", ALGORITHMS), ("pbt", POPULATIONS)):
        for name, entry in entries.items():
            if entry.config == target:
                return group, name
    raise ValueError(
        f"{Path(run_dir) / 'config.json'} names the config {target!r}, which no `onebox train`, "
        "`onebox evolve` or `onebox pbt` command makes: not a run onebox can resume or evaluate"
    )
