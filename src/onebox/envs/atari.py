"""Atari 2600 games through ale-py's native vector engine (`ale_py.ALEVectorInterface`).

    envs = onebox.envs.make("Pong-v5", num_envs=8)                      # the "envpool" preset
    envs = onebox.envs.make("ALE/Pong-v5", preset="machado", stack_num=1)

ALE's engine (C++ threads, EnvPool's design) does the emulation and the preprocessing: frameskip,
max-pooling, grayscale or RGB, resizing (area interpolation), frame stacking, no-op and FIRE
resets, sticky actions, the action set and the frame cap. This pool adds, in vectorized numpy:

- episodic life as EnvPool and the Atari training recipes mean it: `terminated` is true when a
  life is lost, but the game goes on. ALE's own `episodic_life` restarts the whole game at a life
  loss, so the pool runs ALE without it and compares `lives` from step to step. In NextStep mode
  the step after a life-loss termination is a reset step as for any episode: the action sent is
  ignored and FIRE is pressed once (NOOP in games without FIRE or with `use_fire_reset=False`),
  and the step reports reward 0. EnvPool also takes random no-ops there; this pool does not. In
  SameStep mode the game simply continues from the frame the life was lost on.
- reward clipping to sign(reward), so that ALE's unclipped reward stays available;
- `info["episode_return"]`, `info["episode_length"]` and their masks `info["_episode_return"]`,
  `info["_episode_length"]`: when a game really ends (game over or the frame cap, not a lost
  life), its whole-game unclipped score and its length in steps (reset steps after a life loss
  included);
- EnvPool's `send(actions, env_ids)` on top of ALE's `send(actions)`, which only steps the envs of
  the last `recv`, in that order.

`reset_envs(env_ids, seeds)` resets only the envs named, leaving the others as they are (ALE's
partial reset). With seeds, ALE reloads the ROM for each env (tens of ms of CPU), so a seeded env
starts exactly as a fresh one, whatever it played before.

Differences from `NativeEnvPool`, all forced by ALE's engine and raised as clear errors:
`reset()`/`step()` need `batch_size == num_envs` (ALE only sends actions to the envs of the last
`recv`, so a sync step of every env is impossible in an async pool); every env of a `recv` must be
sent its action before the next `recv` (partial sends are buffered until the batch is complete);
an `async_reset()` while steps are in flight rebuilds ALE's engine (about 0.1 s per env); there is
no `Disabled` autoreset (ALE resets an ended game itself); and `reset(options={"reset_mask": m})`
needs a full `reset()` first.
"""

from __future__ import annotations

import difflib
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from onebox import _engine
from onebox.envs.atari_games import (
    ale_module,
    atari_ids,
    game_name,
    games,
    resolve_atari_options,
)
from onebox.envs.base import (
    ActionShapeError,
    EnvPool,
    SeedLike,
    check_pool_args,
    check_seed,
    expand_seeds,
    parse_autoreset_mode,
    reset_needed,
    split_reset_options,
)


def _ale_seed(seed: int, generation: int) -> int:
    """ALE takes 31-bit seeds: hash (seed, generation) into [1, 2**31 - 1]."""
    state = np.random.SeedSequence([seed, generation]).generate_state(1)[0]
    return int(state) % (2**31 - 1) + 1


Results = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class AtariEnvPool(EnvPool):
    """A pool of Atari games stepped by ALE's C++ vector engine (see the module docstring).

    Args:
        env_id: "<Game>-v5" or "ALE/<Game>-v5", e.g. "Pong-v5" (see `onebox.envs.list_envs`).
        num_envs: envs in the pool.
        batch_size: envs returned by each `recv` (default: `num_envs`). Below `num_envs`, the pool
            is async only: use `async_reset`/`send`/`recv`.
        num_threads: ALE worker threads (default: physical cores; at most `num_envs`).
        seed: base seed; env i uses `seed + i`. Results do not depend on threads or scheduling.
        autoreset_mode: `NextStep` (default) or `SameStep` (final observation in
            `info["final_obs"]`, the final step's episode statistics in `info["final_info"]`).
        copy: accepted for the `NativeEnvPool` API; ALE returns new arrays on every call, so the
            arrays returned are always fresh.
        thread_affinity_offset: pin worker k to CPU `offset + k`; -1 (default) leaves them free.
        preset: "envpool" (default) or "machado": the defaults of the options (see
            `onebox.envs.atari_games.PRESETS`).
        **options: the Atari options of `onebox.envs.atari_games.OPTIONS`, overriding the
            preset's.

    Bad input raises `ValueError`/`TypeError`; using the pool after `close()` raises `RuntimeError`.
    """

    @classmethod
    def ids(cls) -> list[str]:
        """Every ALE game as "<Game>-v5" (empty without ale-py)."""
        return atari_ids()

    @classmethod
    def handles(cls, env_id: str) -> bool:
        """Whether `env_id` names an ALE game. Without ale-py, any "<Game>-v5" id is claimed, so
        that `make` can say how to install it."""
        game = game_name(env_id)
        if game is None:
            return False
        try:
            return game in games()
        except ImportError:
            return True

    def __init__(
        self,
        env_id: str,
        num_envs: int = 1,
        *,
        batch_size: int | None = None,
        num_threads: int | None = None,
        seed: int = 0,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        thread_affinity_offset: int = -1,
        preset: str = "envpool",
        **options: Any,
    ) -> None:
        ale_py = ale_module()
        game = game_name(env_id) if isinstance(env_id, str) else None
        if game is None or game not in games():
            close = difflib.get_close_matches(str(env_id), atari_ids(), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f'{env_id!r} is not an ALE game id ("<Game>-v5").{hint}')
        num_envs, batch_size, num_threads = check_pool_args(num_envs, batch_size, num_threads)
        mode = parse_autoreset_mode(autoreset_mode)
        if mode == AutoresetMode.DISABLED:
            raise ValueError(
                "Atari pools take autoreset_mode 'NextStep' or 'SameStep': ALE's engine resets an "
                "ended game itself, so it cannot be disabled"
            )
        if not isinstance(copy, bool | np.bool_):
            raise TypeError(f"copy must be a bool, got {copy!r}")
        if (
            not isinstance(thread_affinity_offset, int | np.integer)
            or isinstance(thread_affinity_offset, bool)
            or thread_affinity_offset < -1
        ):
            raise ValueError(
                "thread_affinity_offset must be -1 (no pinning) or the first CPU index, "
                f"got {thread_affinity_offset!r}"
            )
        config = resolve_atari_options(env_id, preset, options)
        self._rom_path = ale_py.roms.get_rom_path(games()[game])
        self._config = config
        self.num_envs = num_envs
        self.batch_size = batch_size
        self.num_threads = num_threads
        self._affinity = int(thread_affinity_offset)
        self.copy = bool(copy)
        self.autoreset_mode = mode
        self._next_step = mode == AutoresetMode.NEXT_STEP
        self._seeds = expand_seeds(check_seed(seed), num_envs)
        self._generation = 0
        self._seeded = False  # reset once: envs can be stepped
        self._ale_engine: Any = None
        self._build()

        actions = self._ale_engine.get_action_set()
        fire = ale_py.Action.FIRE
        use_fire = config["use_fire_reset"] and fire in actions
        self._life_action = actions.index(fire) if use_fire else 0
        self._num_actions = len(actions)
        channels = () if config["grayscale"] else (3,)
        shape = (config["stack_num"], config["img_height"], config["img_width"], *channels)
        self.single_observation_space = spaces.Box(0, 255, shape, np.uint8)
        self.single_action_space = spaces.Discrete(self._num_actions)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": mode, "render_modes": []}
        self.render_mode = None
        self.spec = EnvSpec(
            id=f"{game}-v5",
            entry_point="onebox.envs:make",
            max_episode_steps=None,
            kwargs={"preset": preset, **config},
        )

        n = num_envs
        self._lives = np.zeros(n, dtype=np.int32)
        self._return = np.zeros(n, dtype=np.float64)
        self._length = np.zeros(n, dtype=np.int64)
        self._game_reset = np.zeros(n, dtype=bool)  # its next result is ALE's NextStep reset
        self._life_reset = np.zeros(n, dtype=bool)  # its next step replaces the action sent
        self._held = np.zeros(n, dtype=bool)  # received, waiting for its action
        self._ids = np.arange(n, dtype=np.int32)  # every env, in order (read-only)
        self._ids.flags.writeable = False
        self._strength = np.ones(n, dtype=np.float32)  # ALE's paddle strength: always full
        self._actions = np.zeros(n, dtype=np.int64)  # actions sent while the batch is partial
        self._last_ids = np.zeros(0, dtype=np.int32)  # ids of ALE's last recv, in its order
        self._in_flight = 0  # envs ALE is stepping or resetting
        self._stash: tuple[Any, ...] | None = None  # first batch of an async reset
        self._last_obs: np.ndarray | None = None  # of reset()/step(), for a masked reset

    # ---- Gymnasium sync API -------------------------------------------------------------------

    def reset(
        self, *, seed: SeedLike = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env; `seed` is an int (env i gets seed + i), one per env, or None.

        `options={"reset_mask": mask}` (a bool array, one per env) resets only the envs masked,
        as in Gymnasium (with `seed`, env i gets `seed + i` or `seed[i]`): see `reset_envs`. The
        other envs keep their observations; the info holds only the reset envs' entries.
        """
        self._check_sync("reset")
        mask, rest = split_reset_options(options, self.num_envs)
        if rest:
            raise ValueError(
                f"Atari envs take no reset options other than reset_mask, got {sorted(rest)}"
            )
        if mask is not None:
            return self._reset_masked(mask, seed)
        if self._in_flight:  # steps sent but not received: collect and drop them
            self._ale_engine.recv()
            self._in_flight = 0
        obs, info = self._ale_engine.reset(self._ids, self._reset_seeds(seed))
        self._start(info)
        self._last_obs = obs
        return obs, self._info(info, np.zeros(self.num_envs, dtype=bool))

    def step(self, actions: Any) -> Results:
        """Step every env with one action each; results in env order."""
        self._check_sync("step")
        if not self._seeded:
            raise reset_needed("step()")
        if self._in_flight or self._stash is not None or not self._held.all():
            raise RuntimeError("step() with async steps pending; recv() them first (or reset())")
        a = self._checked_actions(actions, (self.num_envs,))
        batch = self._last_ids  # ALE's order of the last results: every env, waiting
        chosen = np.where(self._life_reset[batch], self._life_action, a[batch])
        self._ale_engine.send(chosen, self._strength)
        obs, rew, term, trunc, info = self._ale_engine.recv()
        self._last_ids = info["env_id"]  # every env again, each waiting for its action
        self._last_obs = obs
        return self._process(obs, rew, term, trunc, info)

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """Each env's seed: `seed + i` for the pool's `seed` or the last `reset(seed=seed)`."""
        return tuple(self._seeds)

    def _reset_masked(self, mask: np.ndarray, seed: SeedLike) -> tuple[np.ndarray, dict[str, Any]]:
        """`reset(options={"reset_mask": mask})`: every env's observation, the reset envs' info."""
        if not self._seeded:
            raise reset_needed("reset(options={'reset_mask': ...})")
        if self._last_obs is None:
            raise RuntimeError(
                "reset(options={'reset_mask': ...}) follows reset() or step(); after the async "
                "API (send/recv), reset() every env first"
            )
        ids = np.flatnonzero(mask)
        seeds = expand_seeds(seed, self.num_envs)
        obs_ids, info_ids = self.reset_envs(ids, [seeds[i] for i in ids] if seeds else None)
        obs = self._last_obs.copy()
        obs[ids] = obs_ids
        self._last_obs = obs
        info: dict[str, Any] = {"env_id": self._ids.astype(np.int32)}
        for key, value in info_ids.items():
            if key != "env_id":
                info[key] = np.zeros(self.num_envs, dtype=value.dtype)
                info[key][ids] = value
        return obs.copy(), info

    def reset_envs(self, env_ids: Any, seeds: SeedLike = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset only envs `env_ids`; the others are left as they are.

        `seeds`: an int (`env_ids[k]` gets seed + k), one per id, or None (each env goes on with
        its random stream). Returns the reset envs' first observations and info, in the order of
        `env_ids`. Needs a synchronous pool (`batch_size == num_envs`), a full `reset()` first and
        no steps pending; afterwards every env waits for its action, as after `step()`.
        """
        self._check_sync("reset_envs")
        if not self._seeded:
            raise RuntimeError("reset_envs() needs a full reset() of the pool first")
        if self._in_flight or self._stash is not None or not self._held.all():
            raise RuntimeError(
                "reset_envs() needs every env waiting for its action; recv() the steps in "
                "flight (and complete a partial send()) first"
            )
        if env_ids is None:
            raise ValueError("reset_envs() needs the ids of the envs to reset (reset() resets all)")
        ids = self._env_ids(env_ids)
        if ids.size == 0:
            raise ValueError("reset_envs() needs at least one env id")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("env_ids has duplicates; name each env once")
        if seeds is None:
            ale_seeds = [-1] * len(ids)
        else:
            env_seeds = expand_seeds(seeds, len(ids))
            for i, s in zip(ids.tolist(), env_seeds, strict=True):
                self._seeds[i] = s
            ale_seeds = [_ale_seed(s, 0) for s in env_seeds]
        obs, info = self._ale_engine.reset(ids.astype(np.int32), ale_seeds)
        order = info["env_id"]  # ALE's synchronous engine reports every env
        rows = np.empty(self.num_envs, dtype=np.intp)
        rows[order] = np.arange(len(order))
        rows = rows[ids]
        self._lives[ids] = info["lives"][rows]
        self._return[ids] = 0.0
        self._length[ids] = 0
        self._game_reset[ids] = False
        self._life_reset[ids] = False
        self._take(order)
        out = self._info(info, np.zeros(len(order), dtype=bool))
        return obs[rows], {key: value[rows] for key, value in out.items()}

    # ---- EnvPool async API --------------------------------------------------------------------

    def async_reset(self, seed: SeedLike = None) -> None:
        """Reset every env; the first observations come out of `recv`, batch_size at a time."""
        self._check_open()
        seeds = self._reset_seeds(seed)
        if self._in_flight:  # ALE cannot cancel steps in flight: start a fresh engine
            self._build()
            if seed is None:
                self._generation += 1
                seeds = [_ale_seed(s, self._generation) for s in self._seeds]
        obs, info = self._ale_engine.reset(self._ids, seeds)
        self._start(info)
        self._held[:] = False
        self._game_reset[:] = True  # the other envs' reset results come out of ALE's recv
        self._game_reset[info["env_id"]] = False
        self._stash = (obs, info)
        self._in_flight = self.num_envs - len(info["env_id"])

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Step envs `env_ids` (default: all) with `actions`, one per id, without waiting.

        The ids must be envs returned by the last `recv` (or `reset`/`step`) and not sent yet.
        ALE steps a batch once all its envs have their actions, so a partial send is buffered.
        """
        self._check_open()
        if not self._seeded:
            raise reset_needed("send()")
        ids = self._env_ids(env_ids)
        a = self._checked_actions(actions, ids.shape)
        held = self._held
        if not held[ids].all():
            bad = int(ids[~held[ids]][0])
            raise ValueError(
                f"env {bad} is not waiting for an action: send() takes the envs of the last "
                "recv() (or reset()/step()), each once"
            )
        self._last_obs = None  # the sync API's observations are out of date from here
        before = np.count_nonzero(held)
        held[ids] = False
        left = np.count_nonzero(held)
        if before - left != len(ids):  # an id named twice cleared one flag for two actions
            held[ids] = True
            raise ValueError("env_ids has duplicates; send one action per env")
        self._actions[ids] = a
        if left:
            return
        batch = self._last_ids
        chosen = np.where(self._life_reset[batch], self._life_action, self._actions[batch])
        self._ale_engine.send(chosen, self._strength[: len(batch)])
        self._in_flight += len(batch)

    def recv(self) -> Results:
        """Wait for the first `batch_size` sent envs to finish; `info["env_id"]` names them."""
        self._check_open()
        if self._held.any():
            waiting = np.flatnonzero(self._held)[:8].tolist()
            raise RuntimeError(
                f"envs {waiting} of the last recv() still wait for their actions; ALE steps a "
                "batch only when all its envs have one: send() them before recv()"
            )
        if self._stash is not None:
            obs, info = self._stash
            self._stash = None
            rew = np.zeros(len(info["env_id"]), dtype=np.float32)
            none = np.zeros(len(info["env_id"]), dtype=bool)
            self._take(info["env_id"])
            return obs, rew, none, none.copy(), self._info(info, none)
        if self._in_flight == 0:
            raise RuntimeError("recv() with nothing pending; call send() or async_reset() first")
        obs, rew, term, trunc, info = self._ale_engine.recv()
        self._in_flight -= len(rew)
        self._take(info["env_id"])
        return self._process(obs, rew, term, trunc, info)

    def close_extras(self, **kwargs: Any) -> None:
        """Stop ALE's worker threads."""
        self._ale_engine = None

    # ---- internals ----------------------------------------------------------------------------

    def _build(self) -> None:
        c = self._config
        self._ale_engine = None  # stop the old engine's threads before starting new ones
        self._ale_engine = ale_module().ALEVectorInterface(
            self._rom_path,
            self.num_envs,
            frame_skip=c["frameskip"],
            stack_num=c["stack_num"],
            img_height=c["img_height"],
            img_width=c["img_width"],
            grayscale=c["grayscale"],
            maxpool=c["maxpool"],
            noop_max=c["noop_max"],
            use_fire_reset=c["use_fire_reset"],
            episodic_life=False,  # ALE's restarts the game at a life loss; see the module doc
            life_loss_info=False,
            reward_clipping=False,  # clipped here, so that the true score is known
            max_episode_steps=c["max_num_frames_per_episode"],  # ALE counts frames here
            repeat_action_probability=c["repeat_action_probability"],
            full_action_space=c["full_action_space"],
            batch_size=0 if self.batch_size == self.num_envs else self.batch_size,
            num_threads=min(self.num_threads, self.num_envs),
            thread_affinity_offset=self._affinity,
            autoreset_mode=self.autoreset_mode.value,
        )

    def _check_open(self) -> None:
        if self.closed or self._ale_engine is None:
            raise RuntimeError("the env pool is closed; make a new one")

    def _check_sync(self, name: str) -> None:
        self._check_open()
        if self.batch_size != self.num_envs:
            raise RuntimeError(
                f"{name}() needs batch_size == num_envs with ALE's engine, which sends actions "
                f"only to the envs of the last recv(); this pool has batch_size={self.batch_size}"
                f" < num_envs={self.num_envs}: use async_reset()/send()/recv(), or make it "
                "without batch_size"
            )

    def _reset_seeds(self, seed: SeedLike) -> list[int]:
        """ALE seeds for a reset of every env: -1 keeps an env's random stream going."""
        if seed is not None:
            self._seeds = expand_seeds(seed, self.num_envs)
            self._generation = 0
        elif self._seeded:
            return [-1] * self.num_envs
        self._seeded = True
        return [_ale_seed(s, self._generation) for s in self._seeds]

    def _start(self, info: dict[str, np.ndarray]) -> None:
        """Bookkeeping of a reset of every env; `info` is ALE's for the first batch."""
        self._stash = None
        self._last_obs = None
        self._lives[:] = 0
        self._lives[info["env_id"]] = info["lives"]
        self._return[:] = 0.0
        self._length[:] = 0
        self._game_reset[:] = False
        self._life_reset[:] = False
        self._in_flight = 0
        self._take(info["env_id"])

    def _take(self, ids: np.ndarray) -> None:
        """Envs `ids` came back from ALE: they wait for their actions."""
        self._last_ids = ids
        self._held[ids] = True

    def _checked_actions(self, actions: Any, shape: tuple[int, ...]) -> np.ndarray:
        a = np.asarray(actions)
        if a.dtype.kind not in "iu":
            raise TypeError(
                f"Atari actions must be integers, got dtype {a.dtype}; "
                "cast with .astype(np.int64) if the values are whole numbers"
            )
        if a.shape != shape:
            raise ActionShapeError(f"actions must have shape {shape}, got {a.shape}")
        if a.size and (a.min() < 0 or a.max() >= self._num_actions):
            bad = a[(a < 0) | (a >= self._num_actions)][0]
            raise ValueError(f"action {bad} is out of range [0, {self._num_actions})")
        return a

    def _env_ids(self, env_ids: Any) -> np.ndarray:
        if env_ids is None:
            return self._ids
        ids = np.asarray(env_ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"env_ids must be integers, got dtype {ids.dtype}")
        if ids.ndim != 1:
            raise ValueError(f"env_ids must be one-dimensional, got shape {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_envs):
            bad = ids[(ids < 0) | (ids >= self.num_envs)][0]
            raise ValueError(f"env id {bad} is out of range [0, {self.num_envs})")
        return ids.astype(np.intp)

    def _process(
        self,
        obs: np.ndarray,
        raw: np.ndarray,
        term: np.ndarray,
        trunc: np.ndarray,
        info: dict[str, np.ndarray],
    ) -> Results:
        """ALE's step results -> this pool's: episodic life, clipping, episode statistics
        (`atari_ledger.h` does the per-env work, on this pool's state arrays)."""
        ids = info["env_id"]
        n = len(ids)
        reward = np.empty(n, dtype=np.float32)
        terminated, ended, lost = (np.empty(n, dtype=bool) for _ in range(3))
        ret, length = np.empty(n, dtype=np.float64), np.empty(n, dtype=np.int64)
        episodic = self._config["episodic_life"]
        _engine.atari_ledger(
            self._return, self._length, self._lives, self._game_reset, self._life_reset,
            ids, raw, term, trunc, info["lives"],
            reward, terminated, ended, lost, ret, length,
            episodic, self._config["reward_clip"], self._next_step,
        )  # fmt: skip
        out = self._info(info, ended, ret, length)
        if not self._next_step:
            done = ended | lost if episodic else ended
            if done.any():
                self._final(out, obs, info.get("final_obs"), done, ended)
        return obs, reward, terminated, trunc, out

    def _final(
        self,
        info: dict[str, Any],
        obs: np.ndarray,
        ale_final: np.ndarray | None,
        done: np.ndarray,
        ended: np.ndarray,
    ) -> None:
        """SameStep: the final observations and statistics of the episodes that ended."""
        final_obs = np.full(len(done), None, dtype=object)
        for i in np.flatnonzero(done):  # a game over: ALE's final frame; a life lost: this one
            ale = ale_final is not None and ended[i]
            final_obs[i] = ale_final[i].copy() if ale else obs[i].copy()
        info["final_obs"], info["_final_obs"] = final_obs, done
        info["final_info"] = {
            key: info[key]
            for key in ("episode_return", "_episode_return", "episode_length", "_episode_length")
        }
        info["_final_info"] = done.copy()

    def _info(
        self,
        ale_info: dict[str, np.ndarray],
        ended: np.ndarray,
        ret: np.ndarray | None = None,
        length: np.ndarray | None = None,
    ) -> dict[str, Any]:
        n = len(ended)
        everywhere = np.ones(n, dtype=bool)
        info: dict[str, Any] = {"env_id": ale_info["env_id"]}
        for key in ("lives", "frame_number", "episode_frame_number"):
            info[key] = ale_info[key]
            info["_" + key] = everywhere
        info["episode_return"] = ret if ret is not None else np.zeros(n)
        info["episode_length"] = length if length is not None else np.zeros(n, dtype=np.int64)
        info["_episode_return"] = ended
        info["_episode_length"] = ended.copy()
        return info
