"""Env pools backed by the C++ engine: `onebox._engine` (classic control) and `onebox._mujoco`
(MuJoCo locomotion, on the libmujoco onebox ships: see `onebox.envs.mujoco_module`)."""

from __future__ import annotations

import difflib
import functools
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from onebox import _engine
from onebox.envs.base import (
    ActionShapeError,
    EnvPool,
    SeedLike,
    apply_options,
    check_pool_args,
    check_seed,
    expand_seeds,
    parse_autoreset_mode,
    split_reset_options,
)
from onebox.envs.mujoco_module import mujoco_module
from onebox.envs.render import frames_of

_AUTORESET = {AutoresetMode.NEXT_STEP: 0, AutoresetMode.SAME_STEP: 1, AutoresetMode.DISABLED: 2}
"""The engine's code of each autoreset mode (`onebox::Autoreset`)."""


@functools.cache
def _module_table() -> dict[str, ModuleType]:
    table = {env_id: _engine for env_id in _engine.list_envs()}
    mujoco = mujoco_module()
    if mujoco is not None:
        table.update({env_id: mujoco for env_id in mujoco.list_envs()})
    return table


def _module_of(env_id: str) -> ModuleType:
    return _module_table()[env_id]


def native_ids() -> list[str]:
    """Ids of the envs implemented in C++ (the MuJoCo ones only if `onebox._mujoco` loads)."""
    return sorted(_module_table())


def native_options(env_id: str) -> dict[str, tuple[Any, str]]:
    """Constructor options of a native env: name -> (default, doc)."""
    return {
        name: (tuple(default) if isinstance(default, list) else default, doc)
        for name, default, doc in _module_of(env_id).env_options(env_id)
    }


def mujoco_model_path(xml_file: str) -> str:
    """The model file an `xml_file` option names, as Gymnasium's MujocoEnv finds it: a path if it
    starts with "/", "." or "~", else a file in Gymnasium's `envs/mujoco/assets` folder."""
    if xml_file.startswith(("/", ".")):
        path = xml_file
    elif xml_file.startswith("~"):
        path = os.path.expanduser(xml_file)
    else:
        import gymnasium

        path = str(Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets" / xml_file)
    if not os.path.isfile(path):
        raise ValueError(f"xml_file {xml_file!r}: the MuJoCo model {path} does not exist")
    return path


def resolve_options(env_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Merge user keyword arguments into an env's defaults, checking names and types."""
    declared = native_options(env_id)
    defaults = {name: default for name, (default, _) in declared.items()}
    return apply_options(env_id, declared, defaults, kwargs)


def _space(d: dict[str, Any]) -> spaces.Space:
    if d["discrete"]:
        return spaces.Discrete(d["n"])
    shape = tuple(d["shape"])
    low = np.asarray(d["low"], dtype=np.float64).reshape(shape)
    high = np.asarray(d["high"], dtype=np.float64).reshape(shape)
    dtype = np.dtype(d["dtype"])
    return spaces.Box(low.astype(dtype), high.astype(dtype), shape, dtype)


class NativeEnvPool(EnvPool):
    """A pool of C++ envs stepped by the engine's thread pool.

    Args:
        env_id: a native env id (see `onebox.envs.list_envs`).
        num_envs: envs in the pool.
        batch_size: envs returned by each `recv` (default: `num_envs`).
        num_threads: worker threads (default: physical cores). Cheap steps run inline on the
            calling thread whatever this says; the engine times the steps to decide.
        seed: base seed; env i uses `seed + i`. Its episode k draws from a stream keyed by
            (seed + i, k), so results do not depend on threads or scheduling. (The MinAtar games
            draw from one stream per seed, numpy's `RandomState(seed + i)`, as the `minatar`
            package does.)
        autoreset_mode: `NextStep` (Gymnasium's default), `SameStep` (final observation and
            info in `info["final_obs"]`, `info["final_info"]`) or `Disabled` (an env whose episode
            ended raises `ResetNeeded` when stepped until `reset(options={"reset_mask": mask})`).
        max_episode_steps: time limit (truncation); default: the env's own.
        copy: return fresh arrays (default). `False` returns views of the engine's buffers,
            overwritten by the next call: faster, but copy what you keep.
        thread_affinity_offset: pin worker k to CPU `offset + k`; -1 (default) leaves them free.
        render_mode: None, or "rgb_array" to draw frames with `render()` (MuJoCo envs need the
            `mujoco` package and OpenGL for it: `pip install "onebox[mujoco]"`).
        **env_kwargs: the env's own options (e.g. `sutton_barto_reward=True` for CartPole).

    Bad input raises `ValueError`/`TypeError`; using the pool after `close()` raises `RuntimeError`.
    Continuous actions that are NaN are rejected with `ValueError`; finite values outside the
    action bounds are clipped by the env as in Gymnasium.
    """

    @classmethod
    def ids(cls) -> list[str]:
        """Ids of the envs implemented in C++."""
        return native_ids()

    @classmethod
    def handles(cls, env_id: str) -> bool:
        """Whether `env_id` is a native env."""
        return env_id in native_ids()

    def __init__(
        self,
        env_id: str,
        num_envs: int = 1,
        *,
        batch_size: int | None = None,
        num_threads: int | None = None,
        seed: int = 0,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        max_episode_steps: int | None = None,
        copy: bool = True,
        thread_affinity_offset: int = -1,
        render_mode: str | None = None,
        **env_kwargs: Any,
    ) -> None:
        if env_id not in native_ids():
            close = difflib.get_close_matches(env_id, native_ids(), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{env_id!r} is not a native env.{hint}")
        num_envs, batch_size, num_threads = check_pool_args(num_envs, batch_size, num_threads)
        mode = parse_autoreset_mode(autoreset_mode)
        seed = check_seed(seed)
        if not isinstance(thread_affinity_offset, int | np.integer) or thread_affinity_offset < -1:
            raise ValueError(
                "thread_affinity_offset must be -1 (no pinning) or the first CPU index, "
                f"got {thread_affinity_offset!r}"
            )
        config = resolve_options(env_id, env_kwargs)
        module = _module_of(env_id)
        engine_config = dict(config)
        if "xml_file" in config:
            engine_config["xml_file"] = mujoco_model_path(config["xml_file"])
        spec = module.env_spec(env_id, engine_config)
        if max_episode_steps is None:
            max_episode_steps = spec["max_episode_steps"]
        elif not isinstance(max_episode_steps, int | np.integer) or max_episode_steps < 0:
            raise ValueError(
                f"max_episode_steps must be a non-negative integer, got {max_episode_steps!r}"
            )

        self._engine = module.Engine(
            env_id,
            engine_config,
            num_envs,
            batch_size,
            min(num_threads, num_envs),
            thread_affinity_offset,
            _AUTORESET[mode],
            int(max_episode_steps),
            int(seed),
        )
        self.num_envs = num_envs
        self.batch_size = batch_size
        self.num_threads = num_threads
        self.copy = copy
        self.autoreset_mode = mode
        self._same_step = mode == AutoresetMode.SAME_STEP  # (an Enum comparison costs 0.2 us)
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.metadata = {"autoreset_mode": mode, "render_modes": ["rgb_array"]}
        self.render_mode = render_mode
        self._renderer: Any = None
        self.spec = EnvSpec(
            id=env_id,
            entry_point="onebox.envs:make",
            reward_threshold=None
            if np.isnan(spec["reward_threshold"])
            else spec["reward_threshold"],
            max_episode_steps=int(max_episode_steps) or None,
            kwargs=config,
        )
        self.single_observation_space = _space(spec["observation"])
        self.single_action_space = _space(spec["action"])
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

        act = spec["action"]
        self._discrete = act["discrete"]
        self._act_dtype = np.dtype(act["dtype"])
        self._act_shape = () if self._discrete else tuple(act["shape"])
        self._step_shape = (num_envs, *self._act_shape)
        self._info_keys: list[str] = list(spec["info_keys"])
        self._all = self._engine.per_env_buffers()
        self._batch = self._engine.batch_buffers()
        self._all_ids = np.arange(num_envs, dtype=np.int32)
        self._all_ids.flags.writeable = False
        self._true = {n: np.ones(n, dtype=bool) for n in {num_envs, batch_size}}
        for mask in self._true.values():
            mask.flags.writeable = False

    # ---- Gymnasium sync API -------------------------------------------------------------------

    def reset(
        self, *, seed: SeedLike = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env; `seed` is an int (env i gets seed + i), one per env, or None.

        `options={"reset_mask": mask}` (a bool array, one per env) resets only the envs masked,
        as in Gymnasium (with `seed`, env i gets `seed + i` or `seed[i]`); the others keep their
        observations, and the info holds only the reset envs' entries.
        """
        mask, rest = split_reset_options(options, self.num_envs)
        if rest:
            raise ValueError(
                f"native envs take no reset options other than reset_mask, got {sorted(rest)}"
            )
        seeds = expand_seeds(seed, self.num_envs)
        b = self._all
        if mask is None:
            self._engine.reset(seeds)
            obs = b["obs"].copy() if self.copy else b["obs"]
            return obs, self._info(b, self._all_ids, self.num_envs, final=False)
        ids = np.flatnonzero(mask).astype(np.int32)
        self._engine.reset_envs(ids, [seeds[i] for i in ids] if seeds else [])
        obs = b["obs"].copy() if self.copy else b["obs"]
        info = self._info(b, self._all_ids, self.num_envs, final=False)
        for key in self._info_keys:
            info[key] = np.where(mask, info[key], 0.0)
            info["_" + key] = mask
        return obs, info

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """Each env's seed: `seed + i` for the pool's `seed` or the last `reset(seed=seed)`."""
        return tuple(self._engine.seeds)

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with one action each; results in env order."""
        if not self.copy:
            self._engine.step(self._actions(actions, self._step_shape))
            return self._results(self._all, self._all_ids, self.num_envs)
        # New arrays from the engine (the observations written there by the envs), first try
        # with the actions as given.
        out = self._engine.step_copy(actions)
        if out is None:
            out = self._engine.step_copy(self._actions(actions, self._step_shape))
        return (*out, self._info(self._all, self._all_ids, self.num_envs, final=True))

    # ---- EnvPool async API --------------------------------------------------------------------

    def async_reset(self, seed: SeedLike = None) -> None:
        """Reset every env; the first observations come out of `recv`, batch_size at a time."""
        self._engine.async_reset(expand_seeds(seed, self.num_envs))

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Step envs `env_ids` (default: all) with `actions`, one row per id, without waiting."""
        if env_ids is None:
            ids = self._all_ids
        else:
            ids = np.asarray(env_ids)
            if ids.dtype != np.int32:
                if ids.dtype.kind not in "iu":
                    raise TypeError(f"env_ids must be integers, got dtype {ids.dtype}")
                if ids.size and (ids.min() < 0 or ids.max() >= self.num_envs):
                    bad = ids[(ids < 0) | (ids >= self.num_envs)][0]
                    raise ValueError(f"env id {bad} is out of range [0, {self.num_envs})")
                ids = ids.astype(np.int32)
            if ids.ndim != 1:
                raise ValueError(f"env_ids must be one-dimensional, got shape {ids.shape}")
            ids = np.ascontiguousarray(ids)
        self._engine.send(self._actions(actions, (len(ids), *self._act_shape)), ids)

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the first `batch_size` sent envs to finish; `info["env_id"]` names them."""
        self._engine.recv()
        b = self._batch
        ids = b["env_id"].copy() if self.copy else b["env_id"]
        return self._results(b, ids, self.batch_size)

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the worker threads."""
        self._engine.close()
        close = getattr(self._renderer, "close", None)
        if close is not None:
            close()

    def render(self) -> tuple[np.ndarray, ...] | None:
        """One RGB frame per env (`render_mode="rgb_array"`), drawn from each env's current state
        (see `onebox.envs.render`: classic control with numpy, MuJoCo with Gymnasium's renderer)."""
        if self.render_mode is None:
            return None
        if self._renderer is None:
            assert self.spec is not None
            self._renderer = frames_of(self.spec.id, self.spec.kwargs)
        return tuple(
            self._renderer(np.asarray(self._engine.get_state(i), dtype=np.float64))
            for i in range(self.num_envs)
        )

    # ---- closed-loop rollouts ------------------------------------------------------------------

    def policy_size(self, hidden: int = 0) -> int:
        """Parameters of one `rollout` policy: linear (`hidden=0`) or one tanh layer of `hidden`."""
        if not isinstance(hidden, int | np.integer) or isinstance(hidden, bool) or hidden < 0:
            raise ValueError(f"hidden must be a non-negative integer, got {hidden!r}")
        return int(self._engine.policy_params(int(hidden)))

    def rollout(
        self,
        weights: Any,
        *,
        hidden: int = 0,
        obs_mean: Any = None,
        obs_std: Any = None,
        seed: SeedLike = None,
        max_steps: int | None = None,
        obs_clip: float | None = None,
        squash: bool = False,
        obs_sums: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run one whole episode in every env with a policy evaluated in C++; no Python per step.

        Env i resets (a new episode of its seed stream, or of `seed` as in `reset`) and steps until
        it terminates or reaches the time limit (`max_steps`, default the pool's), with the action
        of policy parameters `weights[i]`, computed in float64 on `o' = (o - obs_mean) / obs_std`
        (or `o` itself when no statistics are given):

        - `hidden=0`: `out = W o' + b`; `weights[i]` is W (`[out, obs]`, row-major), then b.
        - `hidden=h`: `out = W2 tanh(W1 o' + b1) + b2`; `weights[i]` is W1 (`[h, obs]`), b1, W2
          (`[out, h]`), b2.

        With `obs_clip`, `o'` is clipped to [-obs_clip, obs_clip]. A Box action is `out` clipped
        to the action bounds, or with `squash` `(low + high) / 2 + (high - low) / 2 * tanh(out)` (out has
        the action's size); a Discrete action is `argmax(out)` (out has n elements).
        `policy_size(hidden)` is the row length.
        The envs run on the pool's threads, one episode per task.

        Args:
            weights: float32-convertible array `[num_envs, policy_size(hidden)]`, finite.
            hidden: tanh units of the hidden layer; 0 for a linear policy.
            obs_mean, obs_std: observation statistics (`[obs size]`, std > 0), or both None.
            seed: reseed the envs first (int: env i gets seed + i); None continues their streams.
            max_steps: episode cap; default the pool's `max_episode_steps` (required if it has none).
            obs_clip: clip the normalized observations to this magnitude (> 0), or None.
            squash: map Box outputs into the bounds with tanh instead of clipping them.
            obs_sums: a float64 array `[num_envs, 2, obs size]` to which env i adds the sums of
                the raw observations its policy saw, and of their squares (for running
                normalization statistics), or None.

        Returns:
            (returns, lengths): float64 episode returns (NaN if the policy output was NaN) and
            int64 episode lengths, one per env. Afterwards every env needs a reset, which the next
            `step` does by itself (as after an episode end; with autoreset disabled, call
            `reset()`); `reset()` also works.
        """
        size = self.policy_size(hidden)
        w = np.asarray(weights)
        if w.dtype.kind not in "fiu":
            raise TypeError(f"weights must be numbers, got dtype {w.dtype}")
        w = np.ascontiguousarray(w, dtype=np.float32)
        if w.shape != (self.num_envs, size):
            raise ValueError(
                f"weights must have shape (num_envs, policy_size(hidden={hidden})) = "
                f"({self.num_envs}, {size}), got {w.shape}"
            )
        if not np.isfinite(w).all():
            raise ValueError("weights contain NaN or infinite values")
        if (obs_mean is None) != (obs_std is None):
            raise ValueError("pass obs_mean and obs_std together, or neither")
        stats: list[np.ndarray | None] = [None, None]
        if obs_mean is not None:
            n = self.single_observation_space.shape
            for k, (name, v) in enumerate((("obs_mean", obs_mean), ("obs_std", obs_std))):
                a = np.ascontiguousarray(v, dtype=np.float64)
                if a.shape != n:
                    raise ValueError(f"{name} must have shape {n}, got {a.shape}")
                if not np.isfinite(a).all():
                    raise ValueError(f"{name} contains NaN or infinite values")
                stats[k] = a.reshape(-1)
            assert stats[1] is not None
            if (stats[1] <= 0).any():
                raise ValueError("obs_std must be positive")
        if max_steps is None:
            cap = 0
            if not self.spec or not self.spec.max_episode_steps:
                raise ValueError("this pool has no time limit: pass max_steps to cap the episodes")
        elif not isinstance(max_steps, int | np.integer) or max_steps <= 0:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        else:
            cap = int(max_steps)
        if obs_clip is not None and not (
            isinstance(obs_clip, int | float | np.integer | np.floating) and obs_clip > 0
        ):
            raise ValueError(f"obs_clip must be a positive number or None, got {obs_clip!r}")
        dim = int(np.prod(self.single_observation_space.shape))
        if obs_sums is not None and (
            not isinstance(obs_sums, np.ndarray)
            or obs_sums.dtype != np.float64
            or obs_sums.shape != (self.num_envs, 2, dim)
            or not obs_sums.flags.c_contiguous
            or not obs_sums.flags.writeable
        ):
            raise ValueError(
                f"obs_sums must be a writeable C-contiguous float64 array of shape "
                f"({self.num_envs}, 2, {dim})"
            )
        returns, lengths = self._engine.rollout(
            w, int(hidden), stats[0], stats[1], cap, expand_seeds(seed, self.num_envs),
            float(obs_clip or 0.0), bool(squash), obs_sums,
        )  # fmt: skip
        return np.asarray(returns, dtype=np.float64), np.asarray(lengths, dtype=np.int64)

    # ---- helpers ------------------------------------------------------------------------------

    def get_state(self, env_id: int) -> np.ndarray:
        """The internal state of env `env_id` (for tests and debugging; not all envs have one)."""
        return np.asarray(self._engine.get_state(self._env_index(env_id)))

    def set_state(self, env_id: int, state: Any) -> None:
        """Overwrite the internal state of env `env_id` (for tests and debugging)."""
        self._engine.set_state(self._env_index(env_id), [float(v) for v in np.ravel(state)])

    def _env_index(self, env_id: Any) -> int:
        if not isinstance(env_id, int | np.integer) or not 0 <= env_id < self.num_envs:
            raise IndexError(f"env id {env_id!r} is out of range [0, {self.num_envs})")
        return int(env_id)

    def _actions(self, actions: Any, shape: tuple[int, ...]) -> np.ndarray:
        a = actions
        if type(a) is not np.ndarray or a.dtype != self._act_dtype or not a.flags.c_contiguous:
            a = np.asarray(actions)
            kind = a.dtype.kind
            if self._discrete and kind not in "iu":
                raise TypeError(
                    f"discrete actions must be integers, got dtype {a.dtype}; "
                    "cast with .astype(np.int64) if the values are whole numbers"
                )
            if not self._discrete and kind not in "fiu":
                raise TypeError(f"continuous actions must be numbers, got dtype {a.dtype}")
            a = np.asarray(a, dtype=self._act_dtype, order="C")
        if a.shape != shape:
            raise ActionShapeError(f"actions must have shape {shape}, got {a.shape}")
        return a

    def _results(
        self, b: dict[str, np.ndarray], ids: np.ndarray, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self.copy:
            obs, rew = b["obs"].copy(), b["reward"].copy()
            term, trunc = b["terminated"].copy(), b["truncated"].copy()
        else:
            obs, rew, term, trunc = b["obs"], b["reward"], b["terminated"], b["truncated"]
        return obs, rew, term, trunc, self._info(b, ids, n, final=True)

    def _info(
        self, b: dict[str, np.ndarray], ids: np.ndarray, n: int, final: bool
    ) -> dict[str, Any]:
        info: dict[str, Any] = {"env_id": ids}
        if self._info_keys:
            values = b["info"]
            for k, key in enumerate(self._info_keys):
                info[key] = values[:, k].copy()
                info["_" + key] = self._true[n]
        if final and self._same_step:
            done = b["final"]
            if done.any():
                idx = np.flatnonzero(done)
                final_obs = np.full(n, None, dtype=object)
                for i in idx:
                    final_obs[i] = b["final_obs"][i].copy()
                final_info: dict[str, Any] = {}
                for k, key in enumerate(self._info_keys):
                    final_info[key] = np.where(done, b["final_info"][:, k], 0.0)
                    final_info["_" + key] = done.copy()
                info["final_obs"], info["_final_obs"] = final_obs, done.copy()
                info["final_info"], info["_final_info"] = final_info, done.copy()
        return info
