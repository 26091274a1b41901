"""Any Python Gymnasium env in worker processes, over shared memory: `ProcessEnvPool`.

Each worker process hosts a contiguous block of envs. Actions, observations, rewards, flags,
episode statistics and numeric infos live in one shared-memory block; a command to a worker is a
few bytes on a pipe (step all my envs, or these env ids), and so is its reply, so nothing is
pickled on the hot path. A worker steps every env it was sent in one go and replies once, so
`recv()` works at worker granularity: it returns the first `batch_size` envs of the workers that
have finished, keeping any surplus for the next `recv()`. The workers are started, talked to
and restarted by a `WorkerLink` (`onebox.envs.process_link`); this module is the pool's API.
"""

from __future__ import annotations

import pickle
import weakref
from collections.abc import Callable
from multiprocessing import resource_tracker
from typing import Any, NoReturn

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from onebox.envs import process_worker as pw
from onebox.envs.base import (
    EnvPool,
    SeedLike,
    check_pool_args,
    check_seed,
    expand_seeds,
    parse_autoreset_mode,
    reset_needed,
    split_reset_options,
)
from onebox.envs.process_link import Proc, WorkerLink, shutdown
from onebox.envs.process_shared import SharedBatch
from onebox.envs.shm import Block
from onebox.supervisor import get_context


class ProcessEnvPool(EnvPool):
    """Gymnasium envs (by id or `env_fn`) stepped in worker processes over shared memory.

    Args:
        env_id: a Gymnasium id (anything in `gymnasium.registry`), or None with `env_fn`.
        num_envs: envs in the pool.
        batch_size: envs returned by each `recv` (default: `num_envs`).
        num_threads: worker processes (default: physical cores), at most `num_envs`. Worker k
            hosts a contiguous block of envs.
        seed: base seed; env i is reset with `seed + i` the first time (or at `reset(seed=...)`).
        env_fn: a zero-argument callable returning a `gymnasium.Env`, instead of `env_id`
            (pickled with cloudpickle, so lambdas and closures work).
        autoreset_mode: `NextStep` (Gymnasium's default: the step after an episode ends resets
            the env and ignores its action), `SameStep` (final observation and info in
            `info["final_obs"]`, `info["final_info"]`) or `Disabled` (an env whose episode ended
            raises `ResetNeeded` when stepped until `reset(options={"reset_mask": mask})`).
        copy: return fresh arrays (default). `False` returns views of shared or batch buffers,
            overwritten by the next call.
        restart_on_crash: restart a worker that dies or raises, reset its envs (with seeds
            derived from the base seed, the env id and the restart count) and report the episodes
            it was running as truncated, with `info["worker_restarted"]`. A worker that fails
            again before completing a command, or while starting, still raises.
        context: multiprocessing start method. "forkserver" (default where available) and
            "spawn" are safe with threads in the parent; "fork" starts fastest but is not.
        spin_us: how long the parent waiting for results, and a worker waiting for its next
            command, poll before they sleep. Waking a sleeping process costs tens of
            microseconds, more than a cheap env's step; 0 always sleeps (saves CPU when steps
            are slow or the machine is oversubscribed).
        **env_kwargs: passed to `gymnasium.make(env_id, ...)`.

    Infos: numeric scalars (Python int, float, bool and numpy numbers; up to 32 keys per worker)
    travel through shared memory and come back batched as in Gymnasium (`key` array, `_key`
    mask, the dtype of the key's first value); any other info value (strings, arrays, nested
    dicts) is pickled on its way to the parent. When an episode ends, `info["episode_return"]`
    and `info["episode_length"]` hold its total reward and steps, masked by
    `info["_episode_return"]` and `info["_episode_length"]`.

    `call`, `get_attr` and `set_attr` reach the envs in the workers, as in Gymnasium's vector
    envs; what the envs raise there is raised here, and the workers go on.

    A worker that raises or dies makes the call raise `RuntimeError` naming the env, the worker,
    and the worker's traceback (or its signal and faulthandler trace); the pool is then closed
    unless `restart_on_crash` is set. A step that never returns blocks like any Python call.
    """

    @classmethod
    def ids(cls) -> list[str]:
        """Every id in Gymnasium's registry (those needing missing packages fail at `make`)."""
        return sorted(gym.registry)

    @classmethod
    def handles(cls, env_id: str) -> bool:
        """Whether `env_id` is in Gymnasium's registry."""
        return env_id in gym.registry

    def __init__(
        self,
        env_id: str | None = None,
        num_envs: int = 1,
        *,
        batch_size: int | None = None,
        num_threads: int | None = None,
        seed: int = 0,
        env_fn: Callable[[], gym.Env] | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        restart_on_crash: bool = False,
        context: str | None = None,
        spin_us: float = 200.0,
        **env_kwargs: Any,
    ) -> None:
        self.closed = True  # until the workers are up: close() and __del__ have nothing to do
        num_envs, batch_size, num_threads = check_pool_args(num_envs, batch_size, num_threads)
        mode = parse_autoreset_mode(autoreset_mode)
        self._seed = check_seed(seed)
        self._ctx = ctx = get_context(context)
        if isinstance(spin_us, bool) or not (
            isinstance(spin_us, int | float) and 0 <= spin_us <= 1e6
        ):
            raise ValueError(
                f"spin_us must be a number of microseconds in [0, 1e6], got {spin_us!r}"
            )
        self._spin = float(spin_us) * 1e-6
        make, name, spec = pw.env_factory(env_id, env_fn, env_kwargs)
        self.env_name = name
        self.num_envs, self.batch_size = num_envs, batch_size
        self.num_threads = min(num_threads, num_envs)
        self.copy, self.restart_on_crash = bool(copy), bool(restart_on_crash)
        self.autoreset_mode = mode
        self._same_step = mode == AutoresetMode.SAME_STEP
        if ctx.get_start_method() == "forkserver":
            ctx.set_forkserver_preload(["__main__", "onebox.envs.process_worker"])
        bounds = np.linspace(0, num_envs, self.num_threads + 1).round().astype(int)
        self._procs = [Proc(k, int(bounds[k]), int(bounds[k + 1])) for k in range(self.num_threads)]
        self._link = WorkerLink(ctx, self._procs, factory=cloudpickle.dumps(make), env_name=name,
                                seed=self._seed, same_step=self._same_step, spin=self._spin,
                                restart_on_crash=self.restart_on_crash, on_result=self._done,
                                fail=self._fail)  # fmt: skip
        self._send, self._pump = self._link.send, self._link.pump
        self._blocks: list[Block] = []
        self._finalizer = weakref.finalize(self, shutdown, self._link.sup, self._blocks)
        self._broken: str | None = None
        try:
            self._start(spec)
        except BaseException:
            self._finalizer()
            raise
        self.closed = False

    # ---- workers -------------------------------------------------------------------------------

    def _start(self, spec: Any) -> None:
        # Workers attach to the shared memory by name, which registers it with the resource
        # tracker: they must share the parent's (forked workers inherit it if it runs already),
        # so that the parent's unlink also unregisters their attachments.
        resource_tracker.ensure_running()
        self._setup(self._link.start(), spec)
        self._link.attach(self._block, self._shm.a["current"])

    def _setup(self, hello: dict[str, Any], spec: Any) -> None:
        n = self.num_envs
        self.single_observation_space = hello["observation_space"]
        self.single_action_space = hello["action_space"]
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self.metadata = {**hello["metadata"], "autoreset_mode": self.autoreset_mode}
        self.render_mode = hello["render_mode"]
        if self.env_name == "env_fn":
            self.env_name = hello["name"]
            self._link.env_name = self.env_name
        self.spec = hello["spec"] if hello["spec"] is not None else spec

        self._shm = SharedBatch(self.single_observation_space, self.single_action_space, n,
                                self._procs, self.batch_size, self._same_step)  # fmt: skip
        self._block = self._shm.block
        self._blocks.append(self._block)
        self._owner = np.repeat(
            np.arange(self.num_threads, dtype=np.int32), [p.hi - p.lo for p in self._procs]
        )
        self._all_ids = np.arange(n, dtype=np.int32)
        self._all_ids.flags.writeable = False
        self._inflight = np.zeros(n, dtype=bool)
        self._num_inflight = 0
        self._ready: list[np.ndarray] = []
        self._num_ready = 0
        self._fresh = np.ones(n, dtype=bool)  # never reset: cannot be stepped
        self._disabled = self.autoreset_mode == AutoresetMode.DISABLED
        self._ended = np.zeros(n, dtype=bool)  # Disabled: ended, not reset since

    # ---- messages ------------------------------------------------------------------------------

    def _done(self, p: Proc, ids: np.ndarray, msg: bytes) -> None:
        """Worker p completed a step or reset of envs `ids` (`msg`: its reply)."""
        self._ready.append(ids)
        self._num_ready += len(ids)
        if msg[:1] == pw.EXTRAS:
            self._shm.add_keys(p, pickle.loads(msg[1:]))

    def _wait_idle(self) -> None:
        self._link.wait_idle()

    def _fail(self, text: str) -> NoReturn:
        self._broken = text
        self._finalizer()
        raise RuntimeError(text)

    # ---- results -------------------------------------------------------------------------------

    def _take_ready(self, b: int) -> np.ndarray:
        ready = self._ready[0] if len(self._ready) == 1 else np.concatenate(self._ready)
        ids, rest = ready[:b].copy(), ready[b:]
        self._ready = [rest] if len(rest) else []
        self._num_ready -= b
        return ids

    def _results(
        self, ids: np.ndarray, index: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, reward, term, trunc = self._shm.results(ids, index, self.copy)
        if self._disabled:
            self._ended[ids] = term | trunc
        return obs, reward, term, trunc, self._shm.info(ids, index, final=True)

    # ---- Gymnasium sync API --------------------------------------------------------------------

    def reset(
        self, *, seed: SeedLike = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env (dropping async work in flight); `seed`: int (env i gets seed + i),
        one per env, or None. `options` go to every env's `reset`.

        `options["reset_mask"]` (a bool array, one per env) resets only the envs masked, as in
        Gymnasium; the others keep their observations, and the info holds only the reset envs'
        entries.
        """
        mask = self._begin_reset(seed, options)
        self._wait_idle()
        self._ready, self._num_ready = [], 0
        self._inflight[:] = False
        self._num_inflight = 0
        index = slice(None)
        return self._shm.observations(index, self.copy), self._shm.info(
            self._all_ids, index, False, mask
        )

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with one action each; results in env order."""
        self._check_usable()
        self._check_stepable(self._all_ids, "step()")
        if self._num_inflight:
            raise RuntimeError(
                f"{self._num_inflight} envs have async steps pending; recv() them or reset() "
                "before step()"
            )
        self._shm.act.write(actions, None, self.num_envs)
        for p in self._procs:
            self._send(p, p.ids, pw.ALL)
        self._wait_idle()
        self._ready, self._num_ready = [], 0
        return self._results(self._all_ids, slice(None))

    # ---- EnvPool async API ---------------------------------------------------------------------

    def async_reset(self, seed: SeedLike = None) -> None:
        """Reset every env; the first observations come out of `recv`, batch_size at a time."""
        self._begin_reset(seed, None)
        self._ended[:] = False
        self._inflight[:] = True
        self._num_inflight = self.num_envs

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Step envs `env_ids` (default: all) with `actions`, one row per id, without waiting."""
        self._check_usable()
        ids = self._all_ids if env_ids is None else self._check_ids(env_ids)
        if self._num_inflight and self._inflight[ids].any():
            bad = int(ids[self._inflight[ids]][0])
            raise ValueError(f"env id {bad} was already sent and not yet received; recv() it first")
        self._check_stepable(ids, "send()")
        self._shm.act.write(actions, ids, len(ids))
        self._inflight[ids] = True
        self._num_inflight += len(ids)
        if env_ids is None:
            for p in self._procs:
                self._send(p, p.ids, pw.ALL)
            return
        owner = self._owner[ids]
        first = owner[0]
        if (owner == first).all():
            self._send(self._procs[first], ids, pw.STEP + ids.tobytes())
            return
        for k in np.unique(owner):
            sub = ids[owner == k]
            self._send(self._procs[k], sub, pw.STEP + sub.tobytes())

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the first `batch_size` sent envs to finish; `info["env_id"]` names them."""
        self._check_usable()
        b = self.batch_size
        if self._num_inflight == 0:
            raise RuntimeError("recv() with nothing pending; call send() or async_reset() first")
        if self._num_inflight < b:
            raise RuntimeError(
                f"recv() would wait forever: {self._num_inflight} envs are pending but batch_size "
                f"is {b}; send() more envs first"
            )
        while self._num_ready < b:
            self._pump()
        ids = self._take_ready(b)
        self._inflight[ids] = False
        self._num_inflight -= b
        return self._results(ids, ids)

    def render(self) -> tuple[Any, ...] | None:
        """Each env's `render()` (e.g. an RGB frame), in env order; None without a render_mode.

        Pass `render_mode="rgb_array"` to `make` (it goes to `gymnasium.make`) to get frames.
        Envs with async steps pending are rendered after those steps.
        """
        self._check_usable()
        if self.render_mode is None:
            return None
        return self.call("render")

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Attribute `name` of every env, called with `args` and `kwargs` if it is callable, in
        env order (as Gymnasium's `call`). Envs with async steps pending answer after them."""
        return self._ask(pw.CALL, lambda p: (name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute `name` of every env, in env order."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute `name` of every env: to `values[i]` for env i if `values` is a list or
        tuple (one per env), else to `values` (as Gymnasium's `set_attr`)."""
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                f"set_attr takes one value per env ({self.num_envs}) or a single value, "
                f"got {len(values)} values"
            )
        self._ask(pw.SET, lambda p: (name, list(values[p.lo : p.hi])))

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """Each env's `np_random_seed` (`seed + i` after `reset(seed=seed)`), as Gymnasium's
        vector envs report it."""
        return self.get_attr("np_random_seed")

    def _ask(self, op: bytes, payload: Callable[[Proc], Any]) -> tuple[Any, ...]:
        """Send command `op` with `payload(worker)` to every worker; their answers in env order,
        or the first exception an env raised."""
        self._check_usable()
        for p in self._procs:
            p.answer = None
            self._send(p, p.ids[:0], op + pickle.dumps(payload(p)))
        while any(p.answer is None for p in self._procs):
            self._pump()
        results: list[Any] = []
        for p in self._procs:
            assert p.answer is not None
            ok, value = p.answer
            if not ok:
                raise value
            results += value
        return tuple(results)

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the workers and free the shared memory (once no `copy=False` view holds it)."""
        self._shm = None  # type: ignore[assignment]
        self._finalizer()

    # ---- helpers -------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(
                f"the env pool is unusable after a crash; make a new one.\n{self._broken}"
            )
        if self.closed:
            raise RuntimeError("the env pool is closed; make a new one")

    def _begin_reset(self, seed: SeedLike, options: dict[str, Any] | None) -> np.ndarray | None:
        """Send the reset of every env, or of those `options["reset_mask"]` names (returned)."""
        self._check_usable()
        seeds: list[int | None] = list(expand_seeds(seed, self.num_envs))
        if not seeds and self._fresh.any():  # an env's first reset uses the pool's seed
            seeds = [self._seed + i if f else None for i, f in enumerate(self._fresh.tolist())]
        mask, rest = split_reset_options(options, self.num_envs)
        options = rest if options is not None else None
        self._wait_idle()  # drop async work in flight: a reset starts everything anew
        self._ready, self._num_ready = [], 0
        self._shm.other.clear()
        chosen = mask if mask is not None else slice(None)
        self._fresh[chosen] = False
        self._ended[chosen] = False
        for p in self._procs:
            mine = seeds[p.lo : p.hi] if seeds else None
            if mask is None:
                self._send(p, p.ids, pw.RESET + pickle.dumps((None, mine, options)))
                continue
            local = np.flatnonzero(mask[p.lo : p.hi])
            if len(local):
                picked = [mine[i] for i in local] if mine else None
                msg = pw.RESET + pickle.dumps((local.tolist(), picked, options))
                self._send(p, p.ids[local], msg)
        return mask

    def _check_stepable(self, ids: np.ndarray, call: str) -> None:
        """Raise `ResetNeeded` if envs `ids` were never reset, or ended with autoreset disabled."""
        if self._fresh[ids].any():
            raise reset_needed(call)
        if self._disabled and self._ended[ids].any():
            bad = int(ids[self._ended[ids]][0])
            raise ResetNeeded(
                f"env {bad}'s episode has ended and autoreset is disabled: reset it first with "
                'reset(options={"reset_mask": mask})'
            )

    def _check_ids(self, env_ids: Any) -> np.ndarray:
        ids = np.asarray(env_ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"env_ids must be integers, got dtype {ids.dtype}")
        if ids.ndim != 1:
            raise ValueError(f"env_ids must be one-dimensional, got shape {ids.shape}")
        if ids.size == 0:
            raise ValueError("send() needs at least one env id")
        listed, n = ids.tolist(), self.num_envs  # Python ints: cheaper than numpy for a batch
        if min(listed) < 0 or max(listed) >= n:
            bad = next(i for i in listed if not 0 <= i < n)
            raise ValueError(f"env id {bad} is out of range [0, {n})")
        if len(set(listed)) != len(listed):
            seen: set[int] = set()
            twice = next(i for i in listed if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise ValueError(f"env id {twice} appears twice in one send()")
        return ids.astype(np.int32)  # a copy: the caller may reuse its array
