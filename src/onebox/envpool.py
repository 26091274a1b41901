"""EnvPool's Python API on onebox's env pools: a script written for EnvPool runs on onebox after
changing `import envpool` to `import onebox.envpool as envpool`.

    envs = envpool.make("Breakout-v5", env_type="gym", num_envs=8, episodic_life=True)
    obs = envs.reset()                                  # old gym API: obs only
    obs, reward, done, info = envs.step(actions)        # info: lives, reward, terminated, ...

`make(task_id, env_type, **kwargs)` takes EnvPool's argument names and defaults (seed 42, no
episodic life, no reward clipping) and maps them onto `onebox.envs.make`. `env_type="gymnasium"`
gives Gymnasium's 5-tuple API, `env_type="gym"` the old gym API of EnvPool with gym < 0.26, for
which CleanRL's EnvPool scripts were written. As in EnvPool, `observation_space` and `action_space`
are one env's spaces, `step(action, env_id)` is `send` then `recv`, autoreset is NextStep, and
`info` has `env_id`, `players`, `elapsed_step` and, for Atari, `lives`, `reward` (unclipped) and
`terminated` (the game is over). Attributes such as `num_envs` or `single_action_space` can be
assigned, as scripts do. An EnvPool argument onebox does not support raises an error naming it.
docs/envpool.md lists what differs from EnvPool.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import VectorEnv

import onebox.envs
from onebox.envs.base import EnvPool

ENV_TYPES = ("gym", "gymnasium")

COMMON_ARGS = ("num_envs", "batch_size", "num_threads", "seed", "max_episode_steps",
               "thread_affinity_offset", "gym_reset_return_info")  # fmt: skip
"""EnvPool arguments every env takes (`make` passes the others to the env itself)."""

ATARI_ARGS: dict[str, str] = {
    "img_height": "img_height",
    "img_width": "img_width",
    "stack_num": "stack_num",
    "gray_scale": "grayscale",
    "frame_skip": "frameskip",
    "noop_max": "noop_max",
    "episodic_life": "episodic_life",
    "use_fire_reset": "use_fire_reset",
    "repeat_action_probability": "repeat_action_probability",
    "full_action_space": "full_action_space",
}
"""EnvPool's Atari options -> the option of onebox's Atari pool
(`onebox.envs.atari_games.OPTIONS`).
`reward_clip` and `max_episode_steps` are handled here."""

ATARI_DEFAULTS = {"episodic_life": False, "reward_clip": False, "max_episode_steps": 27_000}
"""EnvPool's Atari defaults where they differ from onebox's "envpool" preset."""

FIXED_ARGS: dict[str, tuple[Any, str]] = {
    "max_num_players": (1, "onebox's envs have one player"),
    "use_inter_area_resize": (True, "ALE resizes with area interpolation only"),
    "zero_discount_on_life_loss": (False, "it sets dm_env's discount, and onebox has no dm API"),
    "mode": (-1, "onebox's Atari pool plays each game's default mode"),
    "difficulty": (-1, "onebox's Atari pool plays each game's default difficulty"),
    "render_mode": (None, "EnvPool's render() is not part of onebox.envpool"),
    "from_pixels": (False, "onebox renders no pixel observations for MuJoCo"),
}
"""EnvPool arguments onebox takes only at EnvPool's default: name -> (that value, why)."""


def episode_ended(info: dict[str, Any]) -> np.ndarray:
    """The envs of a batch whose whole game (episode) ended: the mask of the pools' episode
    statistics, `info["_episode_return"]`."""
    return np.asarray(info["_episode_return"], dtype=bool)


def make(task_id: str, env_type: str, **kwargs: Any) -> GymnasiumEnvPool | GymEnvPool:
    """Make `kwargs["num_envs"]` envs `task_id` with EnvPool's arguments (see the module doc).

    `env_type` is "gymnasium" (Gymnasium's API) or "gym" (the old gym API: `reset()` returns the
    observations, `step` returns `(obs, reward, done, info)`; needs the `gym` package for its
    spaces). Atari ids are EnvPool's ("Pong-v5"); other ids are onebox's (`onebox envs`).
    """
    if env_type not in ENV_TYPES:
        hint = " (onebox has no dm_env API)" if env_type == "dm" else ""
        raise ValueError(f"env_type must be 'gym' or 'gymnasium', got {env_type!r}{hint}")
    if not isinstance(task_id, str):
        raise TypeError(f"task_id must be a string, got {type(task_id).__name__}")
    for name, (value, why) in FIXED_ARGS.items():
        if name in kwargs and kwargs.pop(name) != value:
            raise ValueError(f"onebox.envpool takes {name}={value!r} only: {why}")
    atari = onebox.envs.backend_of(task_id) == "atari"
    args = {**ATARI_DEFAULTS, **kwargs} if atari else dict(kwargs)
    num_envs = args.pop("num_envs", 1)
    batch_size = args.pop("batch_size", 0) or None  # EnvPool: 0 is num_envs
    num_threads = args.pop("num_threads", 0) or None  # 0 lets the pool choose
    seed = args.pop("seed", 42)
    steps = args.pop("max_episode_steps", None)
    affinity = {k: args.pop(k) for k in ["thread_affinity_offset"] if k in args}
    flags = {"gym_reset_return_info": args.pop("gym_reset_return_info", False)}
    if atari:
        flags["reward_clip"] = args.pop("reward_clip")
    for name, value in flags.items():
        if not isinstance(value, bool | np.bool_):
            raise TypeError(f"{name} takes a bool, got {value!r}")
    if atari:
        unknown = [name for name in args if name not in ATARI_ARGS]
        if unknown:
            known = [*COMMON_ARGS, *ATARI_ARGS, "reward_clip", *FIXED_ARGS]
            close = difflib.get_close_matches(unknown[0], known, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise TypeError(
                f"onebox.envpool does not support the Atari argument(s) {', '.join(unknown)}."
                f"{hint} Supported: {', '.join(known)}."
            )
        if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
            raise ValueError(f"max_episode_steps must be a positive integer, got {steps!r}")
        options = {ATARI_ARGS.get(name, name): value for name, value in args.items()}
        options["reward_clip"] = False  # clipped here, so that info["reward"] keeps the score
        options["max_num_frames_per_episode"] = int(steps) * options.get("frameskip", 4)
    else:
        options = dict(args)  # the env's own options, checked by its pool
        if steps is not None:
            options["max_episode_steps"] = steps
    options.update(affinity)
    first_seed = None
    if isinstance(seed, Sequence | np.ndarray) and not isinstance(seed, str | bytes):
        first_seed, seed = list(seed), 0  # one per env: given to the first reset
    pool = onebox.envs.make(task_id, num_envs, batch_size, num_threads, seed, **options)
    cls = GymEnvPool if env_type == "gym" else GymnasiumEnvPool
    return cls(pool, atari=atari, reward_clip=bool(flags.get("reward_clip", False)),
               first_seed=first_seed, reset_info=bool(flags["gym_reset_return_info"]))  # fmt: skip


def list_all_envs() -> list[str]:
    """Every env id `make` takes (EnvPool's `list_all_envs`): onebox's, see `onebox envs`."""
    return onebox.envs.list_envs()


def make_gym(task_id: str, **kwargs: Any) -> GymEnvPool:
    """`make(task_id, env_type="gym", ...)`."""
    return make(task_id, "gym", **kwargs)  # type: ignore[return-value]


def make_gymnasium(task_id: str, **kwargs: Any) -> GymnasiumEnvPool:
    """`make(task_id, env_type="gymnasium", ...)`."""
    return make(task_id, "gymnasium", **kwargs)  # type: ignore[return-value]


class _EnvPoolAPI:
    """EnvPool's pool API on a onebox pool: results, `info` keys and `elapsed_step` counting."""

    def __init__(
        self,
        pool: EnvPool,
        *,
        atari: bool,
        reward_clip: bool,
        first_seed: list[int] | None,
        reset_info: bool,
    ) -> None:
        self._pool = pool
        self._atari = atari
        self._reward_clip = reward_clip
        self._first_seed = first_seed
        self._reset_info = reset_info
        n = pool.num_envs
        obs_space = pool.single_observation_space
        self._rgb = atari and len(obs_space.shape) == 4
        if self._rgb:  # EnvPool's layout: the stacked frames' channels first
            stack, height, width, channels = obs_space.shape
            obs_space = spaces.Box(0, 255, (stack * channels, height, width), np.uint8)
        self.observation_space = self.single_observation_space = self._space(obs_space)
        self.action_space = self.single_action_space = self._space(pool.single_action_space)
        self.num_envs = n
        self.batch_size = pool.batch_size
        self.is_vector_env = True
        self.spec = pool.spec
        self.metadata = dict(pool.metadata)
        self.closed = False
        self._elapsed = np.zeros(n, dtype=np.int32)  # steps of each env's episode (game)
        self._game_reset = np.zeros(n, dtype=bool)  # its next result starts a new game
        self._life_reset = np.zeros(n, dtype=bool)  # its next result is a lost life's reset step

    def _space(self, space: spaces.Space) -> Any:
        return space

    def __len__(self) -> int:
        return self._pool.num_envs

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def all_env_ids(self) -> np.ndarray:
        """Every env id, as int32."""
        return np.arange(self._pool.num_envs, dtype=np.int32)

    @property
    def is_async(self) -> bool:
        """Whether `recv` returns fewer envs than the pool has."""
        return self._pool.batch_size != self._pool.num_envs

    def _seed(self, seed: Any) -> Any:
        """The seed of a reset: `seed`, or the per-env seeds given to `make` at the first one."""
        first, self._first_seed = self._first_seed, None
        return first if seed is None else seed

    def _reset(self, env_id: Any, seed: Any, options: dict[str, Any] | None) -> tuple[Any, Any]:
        if options:
            raise ValueError(f"onebox.envpool takes no reset options, got {sorted(options)}")
        if env_id is None:
            obs, info = self._pool.reset(seed=self._seed(seed))
            ids = info["env_id"]
        else:  # EnvPool's reset of some envs: Atari pools only (ALE's partial reset)
            reset_envs = getattr(self._pool, "reset_envs", None)
            if reset_envs is None:
                raise ValueError(
                    f"reset(env_id) needs an Atari pool; {type(self._pool).__name__} resets "
                    "every env: call reset() without env_id"
                )
            obs, info = reset_envs(env_id, seed)
            ids = info["env_id"]
        self._game_reset[ids] = True
        none = np.zeros(len(ids), dtype=bool)
        obs, _, _, _, info = self._results(
            obs, np.zeros(len(ids), np.float32), none, none, info, none
        )
        return obs, info

    def _results(
        self,
        obs: Any,
        raw: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: dict[str, Any],
        ended: np.ndarray | None = None,
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """A onebox batch -> EnvPool's: observation layout, clipping, info keys, elapsed steps."""
        ids = info["env_id"]
        if ended is None:  # a game ends with its episode; with episodic life, not at a lost life
            ended = episode_ended(info) if self._atari else terminated | truncated
        elapsed = np.where(self._game_reset[ids], 0, self._elapsed[ids] + ~self._life_reset[ids])
        elapsed = elapsed.astype(np.int32)
        self._elapsed[ids] = elapsed
        self._game_reset[ids] = ended
        self._life_reset[ids] = (terminated | truncated) & ~ended
        if self._rgb:
            b, stack, height, width, channels = obs.shape
            obs = obs.transpose(0, 1, 4, 2, 3).reshape(b, stack * channels, height, width)
        out = {**info, "players": {"env_id": ids}, "elapsed_step": elapsed}
        reward = raw
        if self._atari:
            out["reward"] = raw
            out["terminated"] = (ended & ~truncated).astype(np.int32)
            if self._reward_clip:
                reward = np.sign(raw)
        return obs, reward, terminated, truncated, out

    def send(self, action: Any, env_id: Any = None) -> None:
        """Start stepping envs `env_id` (default: all) with `action`, one row per id."""
        self._pool.send(action, env_id)

    def async_reset(self) -> None:
        """Reset every env; the first observations come out of `recv`."""
        self._pool.async_reset(seed=self._seed(None))
        self._game_reset[:] = True

    def _step(self, action: Any, env_id: Any) -> tuple[Any, ...]:
        if env_id is None and not self.is_async:
            return self._results(*self._pool.step(action))
        self._pool.send(action, env_id)
        return self._results(*self._pool.recv())

    def close(self, **kwargs: Any) -> None:
        """Stop the pool's workers."""
        if not self.closed:
            self._pool.close()
            self.closed = True


class GymnasiumEnvPool(_EnvPoolAPI, VectorEnv):
    """EnvPool's pool with Gymnasium's API (`make(..., env_type="gymnasium")`)."""

    def reset(
        self, env_id: Any = None, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset envs `env_id` (default: all; some: Atari only); returns `(obs, info)`."""
        return self._reset(env_id, seed, options)

    def step(self, action: Any, env_id: Any = None) -> tuple[Any, ...]:
        """`send(action, env_id)` then `recv()`: `(obs, reward, terminated, truncated, info)`."""
        return self._step(action, env_id)

    def recv(self) -> tuple[Any, ...]:
        """The first `batch_size` envs to finish: `(obs, reward, terminated, truncated, info)`."""
        return self._results(*self._pool.recv())


class GymEnvPool(_EnvPoolAPI):
    """EnvPool's pool with the old gym API (`make(..., env_type="gym")`): `reset()` returns the
    observations (`(obs, info)` with `gym_reset_return_info=True`), `step` and `recv` return
    `(obs, reward, done, info)` with `done = terminated | truncated` and
    `info["TimeLimit.truncated"]`. Spaces are the `gym` package's."""

    def _space(self, space: spaces.Space) -> Any:
        try:
            import gym
        except ImportError as e:
            raise ImportError(
                'env_type="gym" needs the gym package for its spaces: pip install gym '
                '(or use env_type="gymnasium")'
            ) from e
        if isinstance(space, spaces.Discrete):
            return gym.spaces.Discrete(int(space.n))
        if isinstance(space, spaces.Box):
            return gym.spaces.Box(space.low, space.high, space.shape, space.dtype)
        raise TypeError(
            f'env_type="gym" supports Box and Discrete spaces, not {space}; '
            'use env_type="gymnasium"'
        )

    def reset(
        self, env_id: Any = None, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> Any:
        """Reset envs `env_id` (default: all; some: Atari only); returns the observations."""
        obs, info = self._reset(env_id, seed, options)
        return (obs, info) if self._reset_info else obs

    def step(self, action: Any, env_id: Any = None) -> tuple[Any, ...]:
        """`send(action, env_id)` then `recv()`: `(obs, reward, done, info)`."""
        return self._old(*self._step(action, env_id))

    def recv(self) -> tuple[Any, ...]:
        """The first `batch_size` envs to finish: `(obs, reward, done, info)`."""
        return self._old(*self._results(*self._pool.recv()))

    @staticmethod
    def _old(obs: Any, reward: Any, terminated: Any, truncated: Any, info: Any) -> tuple:
        info["TimeLimit.truncated"] = truncated
        return obs, reward, terminated | truncated, info
