"""The process env pool's shared memory: its layout, and the batches and infos read out of it.

One block holds every env's observation (and final observation with SameStep autoreset),
action, reward, flags, episode statistics and numeric infos (per worker, up to `MAX_INFO_KEYS`
keys in slots the worker names); `SharedBatch` plans it and turns rows of it into Gymnasium's
batched results. Info values that are not numeric scalars come pickled and wait in `other`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onebox.envs.process_worker import FINAL_INFO, INFO
from onebox.envs.shm import (
    ActionWriter,
    Block,
    Layout,
    add_info,
    assemble,
    copy_tree,
    gather,
    gather_into,
    leaf_array,
    leaves,
)

MAX_INFO_KEYS = 32
"""Numeric info keys per worker that travel through shared memory; more are pickled."""


class SharedBatch:
    """The shared-memory block of `n` envs in `workers` (objects with `lo`, `hi`, `slots` and
    `kinds`: their envs and info slots), and reading batches of results out of it."""

    def __init__(
        self, obs_space: Any, act_space: Any, n: int, workers: list[Any], batch_size: int,
        same_step: bool,
    ) -> None:  # fmt: skip
        self.obs_space, self.workers, self.same_step = obs_space, workers, same_step
        obs_leaves = leaves(obs_space, "observation_space")
        act_leaves = leaves(act_space, "action_space")
        arrays: list[tuple[str, tuple[int, ...], Any]] = []
        for k, (_, leaf) in enumerate(obs_leaves):
            shape, dtype = leaf_array(leaf)
            arrays.append((f"obs{k}", (n, *shape), dtype))
            if same_step:
                arrays.append((f"final_obs{k}", (n, *shape), dtype))
        for k, (_, leaf) in enumerate(act_leaves):
            shape, dtype = leaf_array(leaf)
            arrays.append((f"act{k}", (n, *shape), dtype))
        arrays += [
            ("reward", (n,), np.float64),
            ("terminated", (n,), np.bool_),
            ("truncated", (n,), np.bool_),
            ("final", (n,), np.bool_),
            ("ep_return", (n,), np.float64),
            ("ep_length", (n,), np.int64),
            ("ep_done", (n,), np.bool_),
            ("info_val", (2, n, MAX_INFO_KEYS), np.float64),
            ("info_set", (2, n, MAX_INFO_KEYS), np.bool_),
            ("current", (len(workers),), np.int64),
        ]
        self.block = Block(Layout.plan(arrays))
        a = self.a = self.block.arrays
        a["current"][:] = -1
        self.obs = [a[f"obs{k}"] for k in range(len(obs_leaves))]
        self.final_obs = [a[f"final_obs{k}"] for k in range(len(obs_leaves))] if same_step else []
        self.act = ActionWriter(act_space, [a[f"act{k}"] for k in range(len(act_leaves))])
        self.batch_obs = [np.empty((batch_size, *o.shape[1:]), o.dtype) for o in self.obs]
        self.batch = {
            k: np.empty(batch_size, a[k].dtype) for k in ("reward", "terminated", "truncated")
        }
        self.other: dict[tuple[int, int], dict[str, Any]] = {}
        self.key_dtype: dict[str, np.dtype] = {}

    def add_keys(self, worker: Any, extras: dict[str, Any]) -> None:
        """Record the info slots a worker named, and the pickled infos it sent."""
        for slot, key, kind, dtype in extras["keys"]:
            worker.slots[slot], worker.kinds[slot] = key, kind
            self.key_dtype.setdefault(key, np.dtype(dtype))
        self.other.update(extras["other"])

    def observations(self, index: Any, copy: bool) -> Any:
        """The observations of the rows `index` (a copy if `copy`, else views)."""
        obs = gather(self.obs_space, self.obs, index)
        return copy_tree(obs) if copy else obs

    def results(
        self, ids: np.ndarray, index: Any, copy: bool
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """Observations, rewards and flags of envs `ids` (`index` into the rows: a slice or
        `ids`); with `copy` False, views or reused batch buffers."""
        a, n = self.a, len(ids)
        if isinstance(index, slice):
            obs = gather(self.obs_space, self.obs, index)
            reward, term, trunc = a["reward"], a["terminated"], a["truncated"]
            if copy:
                obs = copy_tree(obs)
                reward, term, trunc = reward.copy(), term.copy(), trunc.copy()
        elif copy:
            obs = gather(self.obs_space, self.obs, index)
            reward, term, trunc = a["reward"][index], a["terminated"][index], a["truncated"][index]
        else:
            obs = gather_into(self.obs_space, self.obs, ids, self.batch_obs)
            out = self.batch
            reward = np.take(a["reward"], ids, out=out["reward"][:n])
            term = np.take(a["terminated"], ids, out=out["terminated"][:n])
            trunc = np.take(a["truncated"], ids, out=out["truncated"][:n])
        return obs, reward, term, trunc

    def info(
        self, ids: np.ndarray, index: Any, final: bool, only: np.ndarray | None = None
    ) -> dict[str, Any]:
        """The info of envs `ids` (`index` into per-env rows); with `only`, of those masked."""
        a, n = self.a, len(ids)
        info: dict[str, Any] = {"env_id": ids}
        self._table(info, INFO, ids, index, only)
        done = a["ep_done"][index]
        if only is not None:
            done = done & only
        if done.any():
            info["episode_return"] = np.where(done, a["ep_return"][index], 0.0)
            info["episode_length"] = np.where(done, a["ep_length"][index], 0)
            info["_episode_return"] = done.copy()
            info["_episode_length"] = done.copy()
        if final and self.same_step:
            f = a["final"][index]
            if f.any():
                final_obs = np.full(n, None, dtype=object)
                for pos in np.flatnonzero(f):
                    g = int(ids[pos])
                    final_obs[pos] = assemble(self.obs_space, (x[g].copy() for x in self.final_obs))
                final_info: dict[str, Any] = {}
                self._table(final_info, FINAL_INFO, ids, index, f)
                info["final_obs"], info["_final_obs"] = final_obs, f.copy()
                info["final_info"], info["_final_info"] = final_info, f.copy()
        return info

    def _table(
        self, out: dict[str, Any], table: int, ids: np.ndarray, index: Any, only: Any
    ) -> None:
        """Batch info table `table` of envs `ids` into `out` (rows masked by `only` if given)."""
        n = len(ids)
        vals_f, sets = self.a["info_val"], self.a["info_set"]
        vals_i = vals_f.view(np.int64)
        for p in self.workers:
            if not p.slots:
                continue
            if isinstance(index, slice):
                rows = np.arange(p.lo, p.hi)
                gids = rows
            else:
                rows = np.flatnonzero((ids >= p.lo) & (ids < p.hi))
                gids = ids[rows]
            if not len(rows):
                continue
            for slot, key in p.slots.items():
                present = sets[table, gids, slot]
                if only is not None:
                    present = present & only[rows]
                if not present.any():
                    continue
                vals = (vals_f if p.kinds[slot] == "f" else vals_i)[table, gids[present], slot]
                if key not in out:
                    out[key] = np.zeros(n, dtype=self.key_dtype[key])
                    out["_" + key] = np.zeros(n, dtype=bool)
                out[key][rows[present]] = vals
                out["_" + key][rows[present]] = True
        if self.other:
            for pos, g in enumerate(ids.tolist()):
                extra = self.other.pop((table, g), None)
                if extra is not None and (only is None or only[pos]):
                    add_info(out, extra, pos, n)
