"""`Table`: what the replay tables share (`ReplayBuffer`, `SequenceReplay`): the checked shapes
and arguments, the RNG, the optional priorities, sampling, priority updates and the .npz file.

A table fills `self.capacity` slots; it gives `_uniform_slots` (a uniform draw of held slots),
`_gather` (the batch of some slots), `_arrays` (its own state) and `_load_arrays`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from onebox.replay.persist import (
    check_config,
    config_array,
    load_npz,
    rng_state,
    save_npz,
    set_rng_state,
)
from onebox.replay.priorities import Priorities, check_priority_args


def subset(state: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The entries of `state` whose names start with `prefix`, the prefix taken off."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


Batch = TypeVar("Batch")


class Table(ABC, Generic[Batch]):
    """The base of the replay tables; see the module docstring."""

    kind: ClassVar[str]  # what the table is called in error messages
    items: ClassVar[str]  # what a slot holds ("transitions", "sequences"), in error messages

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype: Any,
        action_shape: tuple[int, ...],
        action_dtype: Any,
        num_envs: int,
        prioritized: bool,
        alpha: float,
        beta: float,
        beta_steps: int,
        seed: int,
        eps: float,
    ) -> None:
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.action_shape = tuple(int(d) for d in action_shape)
        self.obs_dtype, self.action_dtype = np.dtype(obs_dtype), np.dtype(action_dtype)
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if capacity < num_envs:
            raise ValueError(f"capacity ({capacity}) must be at least num_envs ({num_envs})")
        check_priority_args(alpha, beta, beta_steps, eps)
        self.num_envs, self.capacity = int(num_envs), int(capacity)
        self.config: dict[str, Any] = {
            "capacity": int(capacity), "obs_shape": self.obs_shape,
            "obs_dtype": self.obs_dtype.str, "action_shape": self.action_shape,
            "action_dtype": self.action_dtype.str, "num_envs": int(num_envs),
            "prioritized": bool(prioritized), "alpha": float(alpha), "beta": float(beta),
            "beta_steps": int(beta_steps), "eps": float(eps),
        }  # fmt: skip
        self.rng = np.random.default_rng(seed)
        self.priorities: Priorities | None = None

    def _make_priorities(self) -> None:
        """The priority trees over `self.capacity` slots (once the subclass has fixed it), if
        the table is prioritized."""
        c = self.config
        if c["prioritized"]:
            self.priorities = Priorities(
                self.capacity, c["alpha"], c["beta"], c["beta_steps"], c["eps"]
            )

    @abstractmethod
    def __len__(self) -> int:
        """The items held."""

    @abstractmethod
    def _uniform_slots(self, batch_size: int) -> np.ndarray:
        """`batch_size` held slots, drawn uniformly with replacement."""

    @abstractmethod
    def _gather(self, slots: np.ndarray, weights: np.ndarray) -> Batch:
        """The batch of `slots`, with their importance `weights`."""

    @abstractmethod
    def _arrays(self) -> dict[str, np.ndarray]:
        """The table's own arrays (live views), by name, priorities aside."""

    @abstractmethod
    def _load_arrays(self, state: dict[str, np.ndarray]) -> None:
        """Copy `_arrays`' entries of `state` in place, shapes checked."""

    @property
    def prioritized(self) -> bool:
        """Whether the table samples by priority (and takes `update_priorities`)."""
        return self.priorities is not None

    @property
    def beta(self) -> float:
        """The importance-weight exponent of the next sample (1 when uniform)."""
        return self.priorities.beta if self.priorities else 1.0

    @property
    def nbytes(self) -> int:
        """Bytes of storage held (every array of `state_dict`)."""
        return sum(a.nbytes for a in self.state_dict().values())

    def sample(self, batch_size: int) -> Batch:
        """`batch_size` slots' contents, drawn with replacement: uniformly, or prioritized
        (stratified over `batch_size` equal segments of the priority total)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if batch_size > self.capacity:
            raise ValueError(
                f"batch_size {batch_size} is larger than the capacity {self.capacity}; "
                "make the capacity larger"
            )
        if len(self) == 0:
            raise ValueError(f"sample() from an empty {self.kind}: add() {self.items} first")
        if self.priorities is not None:
            slots, weights = self.priorities.sample(batch_size, self.rng)
        else:
            slots = self._uniform_slots(batch_size)
            weights = np.ones(batch_size, dtype=np.float32)
        return self._gather(slots, weights)

    def _check_indices(self, indices: Any, limit: int) -> np.ndarray:
        """A 1-d integer array of slots in [0, limit)."""
        slots = np.asarray(indices)
        if slots.dtype.kind not in "iu" or slots.ndim != 1:
            raise ValueError(
                f"indices must be a 1-d integer array, got {slots.dtype} {slots.shape}"
            )
        if slots.size and (slots.min() < 0 or slots.max() >= limit):
            raise IndexError(f"indices must be slots in [0, {limit})")
        return slots.astype(np.int64, copy=False)

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """New priorities for sampled slots from TD errors (or, for sequences, `mixed_priority`
        of them): (p + eps) ** alpha."""
        if self.priorities is None:
            raise ValueError("update_priorities() on a uniform table (prioritized=False)")
        slots = self._check_indices(indices, self.capacity)
        self.priorities.update(slots, np.asarray(priorities).reshape(-1))

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every array of the table (live views, not copies); `save` adds its config and RNG."""
        state = self._arrays()
        if self.priorities is not None:
            state |= {f"priorities.{k}": v for k, v in self.priorities.state_dict().items()}
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore a `state_dict()` (with `config` and `rng` from `save`, checked and restored)."""
        if "config" in state:
            check_config(self.kind, self.config, state["config"])
        self._load_arrays(state)
        if self.priorities is not None:
            self.priorities.load_state_dict(subset(state, "priorities."))
        if "rng" in state:
            set_rng_state(self.rng, state["rng"])

    def save(self, path: Any) -> None:
        """Write the whole table, its config and RNG state to one .npz file."""
        save_npz(
            path,
            {**self.state_dict(), "config": config_array(self.config), "rng": rng_state(self.rng)},
        )

    def load(self, path: Any) -> None:
        """Load a `save`d file into this table (built with the same arguments)."""
        self.load_state_dict(load_npz(path))
