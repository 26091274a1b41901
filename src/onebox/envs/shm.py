"""Shared memory for the process backend: one block of named numpy arrays, and the mapping between
nested Gymnasium spaces (Dict, Tuple) and their leaf arrays.

A space is flattened into leaves (Box, Discrete, MultiDiscrete, MultiBinary), each stored as one
array with a leading env axis. The parent writes actions into the action leaves and reads
observations out of the observation leaves; the workers do the opposite, one env at a time.
`add_info` batches per-env info dicts as Gymnasium's vector envs do.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from gymnasium import spaces

from onebox.envs.base import ActionShapeError

LEAF_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
SUPPORTED = "Box, Discrete, MultiDiscrete, MultiBinary, and Dict or Tuple spaces of them"
_ALIGN = 64  # bytes; every array starts on its own cache line

Path = tuple[Any, ...]


def leaves(space: spaces.Space, where: str = "space") -> list[tuple[Path, spaces.Space]]:
    """The leaf spaces of `space` with their paths (dict keys and tuple indices), in order."""
    if isinstance(space, spaces.Dict):
        return [
            ((key, *p), leaf)
            for key, sub in space.spaces.items()
            for p, leaf in leaves(sub, f"{where}[{key!r}]")
        ]
    if isinstance(space, spaces.Tuple):
        return [
            ((i, *p), leaf)
            for i, sub in enumerate(space.spaces)
            for p, leaf in leaves(sub, f"{where}[{i}]")
        ]
    if isinstance(space, LEAF_SPACES):
        return [((), space)]
    raise TypeError(
        f"the process backend cannot share {where} = {space!r}: it supports {SUPPORTED}"
    )


def leaf_array(space: spaces.Space) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one env's value of a leaf space."""
    assert isinstance(space, LEAF_SPACES)
    return tuple(space.shape or ()), np.dtype(space.dtype)


def assemble(space: spaces.Space, values: Iterator[Any]) -> Any:
    """Rebuild a nested value of `space` from its leaves' values, in `leaves` order."""
    if isinstance(space, spaces.Dict):
        return {key: assemble(sub, values) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(assemble(sub, values) for sub in space.spaces)
    return next(values)


def _get(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value


# ---- the block ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each named array lives in the block: name -> (offset, shape, dtype)."""

    fields: dict[str, tuple[int, tuple[int, ...], str]]
    size: int

    @classmethod
    def plan(cls, arrays: Sequence[tuple[str, tuple[int, ...], Any]]) -> Layout:
        """Lay out `(name, shape, dtype)` arrays one after another, each cache-line aligned."""
        fields, offset = {}, 0
        for name, shape, dtype in arrays:
            dt = np.dtype(dtype)
            fields[name] = (offset, tuple(int(s) for s in shape), dt.str)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            offset += -(-nbytes // _ALIGN) * _ALIGN
        return cls(fields, max(offset, _ALIGN))


class Block:
    """A shared-memory block holding the arrays of a `Layout`: created by the parent (`name` None),
    attached by name in the workers. `arrays` maps each name to its numpy view."""

    def __init__(self, layout: Layout, name: str | None = None) -> None:
        self.layout = layout
        self._shm = shared_memory.SharedMemory(name=name, create=name is None, size=layout.size)
        self.name = self._shm.name
        self.arrays: dict[str, np.ndarray] = {
            key: np.ndarray(shape, np.dtype(dtype), buffer=self._shm.buf, offset=offset)
            for key, (offset, shape, dtype) in layout.fields.items()
        }
        if name is None:
            self._shm.buf[: layout.size] = bytes(layout.size)

    def close(self, unlink: bool = False) -> None:
        """Drop this process's mapping (if no view of it is still held) and, if asked, the block."""
        self.arrays = {}
        with contextlib.suppress(BufferError):  # a copy=False view is still held: it lives on
            self._shm.close()
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()


# ---- nested values <-> leaf arrays -------------------------------------------------------------


def writer(space: spaces.Space, arrays: Sequence[np.ndarray]) -> Callable[[int, Any], None]:
    """`write(i, value)`: store one env's nested `value` of `space` at row i of `arrays`."""
    paths = [p for p, _ in leaves(space)]
    if paths == [()]:
        (array,) = arrays

        def write_leaf(i: int, value: Any) -> None:
            array[i] = value

        return write_leaf

    pairs = list(zip(paths, arrays, strict=True))

    def write(i: int, value: Any) -> None:
        for path, array in pairs:
            array[i] = _get(value, path)

    return write


def reader(space: spaces.Space, arrays: Sequence[np.ndarray]) -> Callable[[int], Any]:
    """`read(i)`: env i's nested value of `space`, copied out of `arrays`."""
    if len(arrays) == 1 and isinstance(space, LEAF_SPACES):
        (array,) = arrays
        if array.ndim == 1:
            return array.__getitem__  # a numpy scalar: already a copy
        return lambda i: array[i].copy()
    return lambda i: assemble(space, (a[i].copy() for a in arrays))


def gather(space: spaces.Space, arrays: Sequence[np.ndarray], index: Any) -> Any:
    """The batched nested value of `space` at rows `index` (a slice gives views, ids copies)."""
    return assemble(space, (a[index] for a in arrays))


def gather_into(
    space: spaces.Space, arrays: Sequence[np.ndarray], ids: np.ndarray, out: Sequence[np.ndarray]
) -> Any:
    """Like `gather` with env ids, into the preallocated arrays `out` (returned as views)."""
    n = len(ids)
    for a, o in zip(arrays, out, strict=True):
        np.take(a, ids, axis=0, out=o[:n])
    return assemble(space, (o[:n] for o in out))


class ActionWriter:
    """Checks a batch of actions against the single action space and writes it to the leaves.

    Integer spaces (Discrete, MultiDiscrete, MultiBinary) take integer arrays with every value in
    range; Box takes numbers, and NaN is rejected (finite values outside the bounds are left to the
    env, as in Gymnasium). Dict and Tuple actions are dicts and tuples of such batches.
    """

    def __init__(self, space: spaces.Space, arrays: Sequence[np.ndarray]) -> None:
        self.space = space
        self._leaves = [
            (path, leaf, array, *self._bounds(leaf))
            for (path, leaf), array in zip(leaves(space), arrays, strict=True)
        ]
        self._single = len(self._leaves) == 1 and self._leaves[0][0] == ()

    @staticmethod
    def _bounds(leaf: spaces.Space) -> tuple[Any, Any]:
        if isinstance(leaf, spaces.Discrete):
            return int(leaf.start), int(leaf.start + leaf.n - 1)
        if isinstance(leaf, spaces.MultiDiscrete):
            return leaf.start, leaf.start + leaf.nvec - 1
        if isinstance(leaf, spaces.MultiBinary):
            return 0, 1
        return None, None

    def write(self, actions: Any, ids: np.ndarray | None, n: int) -> None:
        """Check `actions` for `n` envs and store them at rows `ids` (all rows if None).

        Raises before writing anything if any part is bad, so a rejected call changes nothing.
        """
        if self._single:
            path, leaf, array, lo, hi = self._leaves[0]
            checked = [(array, self._check(actions, leaf, lo, hi, n, ids, "actions"))]
        else:
            checked = []
            for path, leaf, array, lo, hi in self._leaves:
                where = "actions" + "".join(f"[{k!r}]" for k in path)
                checked.append(
                    (array, self._check(self._part(actions, path), leaf, lo, hi, n, ids, where))
                )
        for array, value in checked:
            if ids is None:
                array[...] = value
            else:
                array[ids] = value

    def _part(self, actions: Any, path: Path) -> Any:
        value, where = actions, "actions"
        for key in path:
            if isinstance(key, str):
                if not isinstance(value, dict) or key not in value:
                    raise TypeError(f"{where} must be a dict with the key {key!r} (Dict space)")
                where += f"[{key!r}]"
            else:
                if not isinstance(value, tuple | list) or key >= len(value):
                    raise TypeError(f"{where} must be a tuple with an item {key} (Tuple space)")
                where += f"[{key}]"
            value = value[key]
        return value

    @staticmethod
    def _check(
        value: Any, leaf: spaces.Space, lo: Any, hi: Any, n: int, ids: Any, where: str
    ) -> np.ndarray:
        shape = (n, *(leaf.shape or ()))
        a = value if type(value) is np.ndarray else np.asarray(value)
        integral = not isinstance(leaf, spaces.Box)
        kind = a.dtype.kind
        if integral and kind not in "iub":
            raise TypeError(
                f"{where}: {type(leaf).__name__} actions must be integers, got dtype {a.dtype}; "
                "cast with .astype(np.int64) if the values are whole numbers"
            )
        if not integral and kind not in "fiub":
            raise TypeError(f"{where}: continuous actions must be numbers, got dtype {a.dtype}")
        if a.shape != shape:
            raise ActionShapeError(f"{where} must have shape {shape}, got {a.shape}")
        if integral and a.size:
            bad = (a < lo) | (a > hi)
            if bad.any():
                k = np.argwhere(bad)[0]
                env = int(ids[k[0]]) if ids is not None else int(k[0])
                raise ValueError(
                    f"action {a[tuple(k)]} for env {env} is out of range: {leaf} takes "
                    f"{np.min(lo)}..{np.max(hi)}"
                )
        elif kind == "f" and np.isnan(a).any():
            env = int(np.argwhere(np.isnan(a))[0][0])
            env = int(ids[env]) if ids is not None else env
            raise ValueError(
                f"{where}: action for env {env} contains NaN; NaN actions are rejected (finite "
                "values outside the bounds are left to the env)"
            )
        return a


def add_info(infos: dict[str, Any], env_info: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """Put one env's info at row i of the batched `infos`, as Gymnasium's `VectorEnv._add_info`."""
    for key, value in env_info.items():
        if isinstance(value, dict):
            array = add_info(infos.get(key, {}), value, i, n)
        else:
            array = infos.get(key)
            if array is None:
                if type(value) in (int, float, bool) or isinstance(value, np.number):
                    array = np.zeros(n, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    array = np.zeros((n, *value.shape), dtype=value.dtype)
                else:
                    array = np.full(n, None, dtype=object)
            array[i] = value
        mask = infos.get("_" + key)
        if mask is None:
            mask = np.zeros(n, dtype=bool)
        mask[i] = True
        infos[key], infos["_" + key] = array, mask
    return infos


def copy_tree(value: Any) -> Any:
    """A copy of a nested (dict/tuple) value of arrays."""
    if isinstance(value, dict):
        return {k: copy_tree(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(copy_tree(v) for v in value)
    return value.copy()
