"""`Population`: N trainers of one learner in this process, ranked, copied and mutated in memory.

Each member is the learner's own trainer (`onebox.algos.trainer.Trainer`), built from the same
config with its own seed, its envs seeded from the run's one `EnvSeeds`. The population steps
them in turn (each one trainer step), and every `ready` env steps per member it ranks them by
the objective (the mean return of each member's last `episodes` finished episodes since it last
copied), lets each chosen child load its parent's whole state (weights, optimizer state,
normalizers, hyperparameters and counters; `Trainer.load_state_dict`, no file in between), and
explores the child's hyperparameters (`explore.Explore`). The lineage records every member's
hyperparameters at its start and at each copy, with whom it copied and the parent's state hash.
"""

from __future__ import annotations

import collections
import copy
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from onebox.algos.trainer import Range, Trainer
from onebox.pbt.explore import Explore, Selection, draw, pairs


def state_hash(state: Any) -> str:
    """A hash of a state's every tensor and number (sha256 of their bytes in key order) but its
    optimizers' `param_groups` (their hyperparameters, which a copy's explore changes): two
    learner states hash alike exactly when their weights, optimizer moments, normalizers and
    counters are equal."""
    digest = hashlib.sha256()

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(str((value.dtype, tuple(value.shape))).encode())
            digest.update(
                value.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
            )
        elif isinstance(value, np.ndarray):
            digest.update(str((value.dtype, value.shape)).encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, Mapping):
            for key in sorted(value, key=str):
                if key == "param_groups":
                    continue
                digest.update(str(key).encode())
                visit(value[key])
        elif isinstance(value, list | tuple):
            for item in value:
                visit(item)
        else:
            digest.update(repr(value).encode())

    visit(state)
    return digest.hexdigest()[:16]


def objective(window: Sequence[float]) -> float | None:
    """A member's objective: the mean return of its window of episodes (None: none yet)."""
    return float(np.mean(window)) if len(window) else None


def best_of(windows: Sequence[Sequence[float]]) -> int:
    """The member whose window scores highest (the first on a tie; 0 before any episode)."""
    scores = [objective(w) for w in windows]
    return int(np.argmax([-np.inf if s is None else s for s in scores]))


class Population:
    """The members and what population-based training keeps of them (see the module's
    docstring). `space` is the mutated hyperparameters' ranges; `rng` makes every decision."""

    def __init__(
        self,
        members: Sequence[Trainer],
        space: Mapping[str, Range],
        rng: np.random.Generator,
        *,
        ready: int,
        selection: Selection,
        quantile: float,
        explore: Explore,
        episodes: int,
    ) -> None:
        self.members, self.space, self.rng = list(members), dict(space), rng
        self.ready, self.selection, self.quantile = ready, selection, quantile
        self.explore, self.episodes = explore, episodes
        self.windows = [collections.deque[float](maxlen=episodes) for _ in self.members]
        self.lineage: list[dict[str, Any]] = []
        self.rounds = 0

    def draw(self) -> None:
        """A new population: each member's hyperparameters drawn from the space (lineage: its
        start)."""
        for i, member in enumerate(self.members):
            member.hp.set(**draw(self.space, self.rng))
            self._record(i, member.global_step, parent=None, parent_hash=None, score=None)

    @property
    def step(self) -> int:
        """Env steps of the member furthest behind."""
        return min(m.global_step for m in self.members)

    @property
    def done(self) -> bool:
        return all(m.done for m in self.members)

    def record(self, member: int, returns: Sequence[float]) -> None:
        """Finished episodes of `member` (its objective's window)."""
        self.windows[member].extend(returns)

    def score(self, member: int) -> float | None:
        """The objective of `member`: the mean return of its window (None: no episode yet)."""
        return objective(self.windows[member])

    def scores(self) -> list[float | None]:
        return [self.score(i) for i in range(len(self.members))]

    def best(self) -> int:
        """The member with the highest score (the first on a tie; 0 before any)."""
        return best_of(self.windows)

    def due(self) -> bool:
        """Whether every member has passed the next ready point (and some are not done)."""
        return self.step >= (self.rounds + 1) * self.ready and not self.done

    def exploit_and_explore(self) -> list[tuple[int, int]]:
        """One round: rank, copy, explore; returns the (child, parent) pairs. The parents'
        states are taken before any copy, so a member that is copied and copies in one round
        (a tournament) hands on its state from before the round."""
        self.rounds += 1
        scores = self.scores()
        chosen = pairs(scores, self.selection, self.quantile, self.rng)
        states = {p: copy.deepcopy(self.members[p].state_dict()) for p in {p for _, p in chosen}}
        hashes = {p: state_hash(state["learner"]) for p, state in states.items()}
        for child, parent in chosen:
            member = self.members[child]
            member.load_state_dict(states[parent])
            member.hp.set(**self.explore(member.hp.base(), self.space, self.rng))
            self.windows[child].clear()
            self._record(child, member.global_step, parent=parent, parent_hash=hashes[parent],
                         score=scores[child], parent_score=scores[parent])  # fmt: skip
        return chosen

    def _record(self, member: int, step: int, **event: Any) -> None:
        self.lineage.append({"step": int(step), "member": member, **event,
                             "hyperparams": self.members[member].hp.base()})  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """Everything but the members' own states: the generator, windows, rounds, lineage."""
        return {
            "rng": self.rng.bit_generator.state,
            "windows": [list(w) for w in self.windows],
            "rounds": self.rounds,
            "lineage": copy.deepcopy(self.lineage),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        for window, saved in zip(self.windows, state["windows"], strict=True):
            window.clear()
            window.extend(saved)
        self.rounds = int(state["rounds"])
        self.lineage = copy.deepcopy(state["lineage"])
