"""The worker process of `ProcessEnvPool`: it hosts a contiguous block of envs, steps the ones it is
told to, and writes their results into the pool's shared memory.

Protocol (every message is framed by `write_msg` and tagged by its first byte; a bare tag is read
with one system call). Startup: the
worker makes its envs and sends HELLO with their spaces; the parent answers with the shared-memory
block's name and layout; the worker attaches and sends READY. Then, per command (ALL: step all
my envs; STEP + int32 env ids; RESET + pickled (env ids or None for all, seeds, options); CALL +
pickled (name, args, kwargs); SET + pickled (name, one value per env); QUIT), it sends DONE, or
EXTRAS + a pickle of what did not fit in shared memory (new info keys, non-numeric infos), or
ANSWER + a pickle of (True, [one result per env]) or (False, the exception a CALL or SET raised),
or ERROR + a pickle of the exception's type, message, traceback and env id, after which it exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import os
import pickle
import select
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from onebox.envs.shm import Block, leaves, reader, writer

HELLO, READY, DONE, EXTRAS, ANSWER, ERROR = b"H", b"R", b"D", b"X", b"F", b"E"
ALL, STEP, RESET, CALL, SET, QUIT = b"A", b"S", b"Z", b"C", b"T", b"Q"

INFO, FINAL_INFO = 0, 1
"""The two info tables in shared memory: the step's info and, in SameStep mode, the final info."""

_PARENT_CHECK_MS = 1000  # how often an idle worker checks that its parent is still alive


def write_msg(fd: int, msg: bytes) -> None:
    """Write one message (a 4-byte length, then `msg`) to the pipe `fd`."""
    data = len(msg).to_bytes(4, "little") + msg
    while data:
        data = data[os.write(fd, data) :]


def _read_exact(fd: int, n: int) -> bytes:
    data = os.read(fd, n)
    while len(data) < n:
        if not data:
            raise EOFError("the other end of the pipe is closed")
        more = os.read(fd, n - len(data))
        if not more:
            raise EOFError("the other end of the pipe is closed")
        data += more
    return data


def read_msg(fd: int) -> bytes:
    """Read one message written by `write_msg` (raises EOFError if the writer is gone)."""
    head = _read_exact(fd, 5)  # the length and the tag: every message has a tag
    n = int.from_bytes(head[:4], "little")
    return head[4:] + _read_exact(fd, n - 1) if n > 1 else head[4:]


def wait(poller: select.poll, spin: float, timeout_ms: int | None) -> list[tuple[int, int]]:
    """`poller.poll(timeout_ms)`, but polling without sleeping for the first `spin` seconds.

    A process woken from sleep takes tens of microseconds to run again, longer than a cheap env's
    step, so each side of a step spins for a while before sleeping; it yields the CPU between
    polls so that a process with work to do on the same core runs first.
    """
    if spin > 0:
        end = time.perf_counter() + spin
        while True:
            events = poller.poll(0)
            if events:
                return events
            if time.perf_counter() >= end:
                break
            os.sched_yield()
    return poller.poll(timeout_ms)


def make_from_spec(spec: Any, kwargs: dict[str, Any]) -> Any:
    """`gymnasium.make(spec, **kwargs)`: what a worker calls to make an env given by id."""
    return gym.make(spec, **kwargs)


def env_factory(
    env_id: str | None, env_fn: Any, env_kwargs: dict[str, Any]
) -> tuple[Callable[[], Any], str, Any]:
    """What makes a worker's envs (`env_fn`, or `gymnasium.make` of `env_id` with `env_kwargs`),
    the envs' name and the id's spec (None with `env_fn`); bad arguments raise, naming the fix."""
    if env_fn is not None:
        if not callable(env_fn):
            raise TypeError(f"env_fn must be a callable returning a gymnasium.Env, got {env_fn!r}")
        if env_kwargs:
            raise TypeError(
                f"env options {sorted(env_kwargs)} go to gymnasium.make; with env_fn, give "
                "them to your env_fn (e.g. functools.partial)"
            )
        return env_fn, "env_fn" if env_id is None else str(env_id), None
    if env_id is None:
        raise ValueError("give env_id (a Gymnasium id) or env_fn (a callable making an env)")
    if not isinstance(env_id, str):
        raise TypeError(f"env_id must be a string, got {type(env_id).__name__}")
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown env id {env_id!r}: not in gymnasium.registry.{hint}")
    spec = gym.spec(env_id)
    return functools.partial(make_from_spec, spec, dict(env_kwargs)), env_id, spec


def info_kind(value: Any) -> str | None:
    """How a scalar info value is stored: "i" (int64), "f" (float64), or None (pickled).

    Numeric follows Gymnasium's `_add_info`: Python int, float and bool, and numpy numbers.
    """
    t = type(value)
    if t is bool or t is int:
        return "i"
    if t is float:
        return "f"
    if issubclass(t, np.number):
        dt = np.dtype(t)
        if dt.kind == "f" and dt.itemsize <= 8:
            return "f"
        if dt.kind == "i" or (dt.kind == "u" and dt.itemsize < 8):
            return "i"
    return None


@dataclasses.dataclass
class WorkerArgs:
    """What a worker is started with (pickled to the new process)."""

    index: int
    lo: int
    hi: int
    factory: bytes
    """cloudpickle of a zero-argument callable returning a `gymnasium.Env`."""
    same_step: bool
    max_info_keys: int
    restart_seeds: list[int] | None
    """Set when restarting after a crash: reset every env with these and report them truncated."""
    slots: dict[str, tuple[int, str]]
    """Info key -> (slot, kind) already assigned (kept across restarts)."""
    spin: float
    """Seconds to poll for the next command before sleeping (see `wait`)."""


def describe(env: Any) -> dict[str, Any]:
    """What the parent needs to know about an env (sent in HELLO)."""
    try:
        spec = pickle.loads(pickle.dumps(env.spec))
    except Exception:  # an unpicklable entry point or kwargs: the pool goes without a spec
        spec = None
    return {
        "name": spec.id if spec is not None else type(env.unwrapped).__name__,
        "observation_space": env.observation_space,
        "action_space": env.action_space,
        "metadata": dict(getattr(env, "metadata", {}) or {}),
        "render_mode": getattr(env, "render_mode", None),
        "spec": spec,
    }


class Worker:
    """A block of envs [lo, hi) and the shared arrays they read actions from and write results to."""

    def __init__(self, args: WorkerArgs, envs: list[Any], block: Block) -> None:
        self.args, self.envs, self.block = args, envs, block
        a = block.arrays
        obs_space, act_space = envs[0].observation_space, envs[0].action_space
        n_obs, n_act = len(leaves(obs_space)), len(leaves(act_space))
        self.write_obs = writer(obs_space, [a[f"obs{k}"] for k in range(n_obs)])
        self.write_final = (
            writer(obs_space, [a[f"final_obs{k}"] for k in range(n_obs)])
            if args.same_step
            else None
        )
        self.read_action = reader(act_space, [a[f"act{k}"] for k in range(n_act)])
        self.reward, self.term, self.trunc = a["reward"], a["terminated"], a["truncated"]
        self.final, self.current = a["final"], a["current"]
        self.ep_return, self.ep_length, self.ep_done = a["ep_return"], a["ep_length"], a["ep_done"]
        self.vals_f, self.info_set = a["info_val"], a["info_set"]
        self.vals_i = self.vals_f.view(np.int64)
        n = args.hi - args.lo
        self.all = list(range(n))
        self.needs_reset = [True] * n
        self.cached: list[tuple[Any, dict[str, Any]] | None] = [None] * n
        self.crashed = [False] * n
        self.ret = [0.0] * n
        self.len = [0] * n
        self.dirty = ([False] * n, [False] * n)
        self.slots = dict(args.slots)
        self.new_keys: list[tuple[int, str, str, str]] = []
        self.other: dict[tuple[int, int], dict[str, Any]] = {}

    # ---- commands ------------------------------------------------------------------------------

    def step(self, ids: list[int]) -> None:
        lo, current, k = self.args.lo, self.current, self.args.index
        for i in ids:
            current[k] = lo + i
            if self.needs_reset[i]:
                self.reset_one(i, None, None, use_cached=True)
            elif self.crashed[i]:
                self.crash_result(i)
            else:
                self.step_one(i)
        current[k] = -1

    def reset(
        self, ids: list[int] | None, seeds: list[int] | None, options: dict[str, Any] | None
    ) -> None:
        """Reset envs `ids` (all if None), with `seeds` (one per id) or None."""
        lo, current, k = self.args.lo, self.current, self.args.index
        for j, i in enumerate(self.all if ids is None else ids):
            current[k] = lo + i
            self.cached[i] = None
            self.reset_one(i, None if seeds is None else seeds[j], options, use_cached=False)
        current[k] = -1

    def restart(self, seeds: list[int]) -> None:
        """Start every env anew after a crash; their next step reports the lost episode."""
        lo, current, k = self.args.lo, self.current, self.args.index
        for i, env in enumerate(self.envs):
            current[k] = lo + i
            self.cached[i] = env.reset(seed=seeds[i])
            self.crashed[i], self.needs_reset[i] = True, False
        current[k] = -1

    # ---- one env -------------------------------------------------------------------------------

    def step_one(self, i: int) -> None:
        g = self.args.lo + i
        obs, reward, terminated, truncated, info = self.envs[i].step(self.read_action(g))
        self.reward[g], self.term[g], self.trunc[g] = reward, terminated, truncated
        ret, length = self.ret[i] + float(reward), self.len[i] + 1
        done = bool(terminated or truncated)
        self.ep_done[g] = done
        if done:
            self.ep_return[g], self.ep_length[g] = ret, length
            ret, length = 0.0, 0
        self.ret[i], self.len[i] = ret, length
        if self.write_final is not None:
            self.final[g] = done
            if done:
                self.write_final(g, obs)
                self.write_info(FINAL_INFO, i, info)
                obs, info = self.envs[i].reset()
        elif done:
            self.needs_reset[i] = True
        self.write_obs(g, obs)
        self.write_info(INFO, i, info)

    def reset_one(
        self, i: int, seed: int | None, options: dict[str, Any] | None, use_cached: bool
    ) -> None:
        g = self.args.lo + i
        cached = self.cached[i] if use_cached else None
        if cached is not None:
            obs, info = cached
        else:
            obs, info = self.envs[i].reset(seed=seed, options=options)
        self.cached[i] = None
        self.needs_reset[i] = self.crashed[i] = False
        self.ret[i], self.len[i] = 0.0, 0
        self.reward[g], self.term[g], self.trunc[g] = 0.0, False, False
        self.ep_done[g] = self.final[g] = False
        self.write_obs(g, obs)
        self.write_info(INFO, i, info)

    def crash_result(self, i: int) -> None:
        """The result of env i's first step after its worker was restarted: its episode was lost,
        so it ends truncated, with the new episode's first observation standing in for the last."""
        g = self.args.lo + i
        cached = self.cached[i]
        assert cached is not None
        obs, info = cached
        self.crashed[i] = False
        self.reward[g], self.term[g], self.trunc[g] = 0.0, False, True
        self.ep_done[g] = False
        self.ret[i], self.len[i] = 0.0, 0
        if self.write_final is not None:  # SameStep: the new episode starts now
            self.cached[i] = None
            self.final[g] = True
            self.write_final(g, obs)
            self.write_info(FINAL_INFO, i, {})
            info = {**info, "worker_restarted": True}
        else:  # NextStep: the next step is the reset step, which returns the cached reset
            self.needs_reset[i] = True
            info = {"worker_restarted": True}
        self.write_obs(g, obs)
        self.write_info(INFO, i, info)

    def write_info(self, table: int, i: int, info: dict[str, Any]) -> None:
        """Numeric scalar infos into their shared slots; anything else kept for the reply."""
        dirty = self.dirty[table]
        g = self.args.lo + i
        if not info:
            if dirty[i]:
                self.info_set[table, g] = False
                dirty[i] = False
            return
        row = self.info_set[table, g]
        row[:] = False
        dirty[i] = True
        for key, value in info.items():
            kind = info_kind(value)
            if kind is not None:
                slot = self.slots.get(key)
                if slot is None and len(self.slots) < self.args.max_info_keys:
                    slot = self.slots[key] = (len(self.slots), kind)
                    self.new_keys.append((slot[0], key, kind, np.dtype(type(value)).str))
                if slot is not None and slot[1] == kind:
                    (self.vals_f if kind == "f" else self.vals_i)[table, g, slot[0]] = value
                    row[slot[0]] = True
                    continue
            self.other.setdefault((table, g), {})[key] = value

    def reply(self) -> bytes:
        if not self.new_keys and not self.other:
            return DONE
        extras = {"keys": self.new_keys, "other": self.other}
        self.new_keys, self.other = [], {}
        try:
            return EXTRAS + pickle.dumps(extras, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise TypeError(
                f"an env returned an info value that cannot be pickled ({e}); the process "
                "backend sends non-numeric infos to the parent by pickling them"
            ) from e

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        """As Gymnasium's `call`: attribute `name` of each env, called with the arguments if it
        is callable. What it raises goes back to the caller; the worker goes on."""

        def one(i: int, env: Any) -> Any:
            attr = env.get_wrapper_attr(name)
            return attr(*args, **kwargs) if callable(attr) else attr

        return self._answer(one)

    def set(self, name: str, values: list[Any]) -> bytes:
        """Set attribute `name` of env i to values[i], as Gymnasium's `set_attr`."""
        return self._answer(lambda i, env: env.set_wrapper_attr(name, values[i]))

    def _answer(self, fn: Callable[[int, Any], Any]) -> bytes:
        """ANSWER with fn(i, env) for each env, or with the exception one of them raised."""
        k = self.args.index
        results = []
        try:
            for i, env in enumerate(self.envs):
                self.current[k] = self.args.lo + i
                results.append(fn(i, env))
            return ANSWER + pickle.dumps((True, results), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            try:
                return ANSWER + pickle.dumps((False, e))
            except Exception:  # an exception that cannot be pickled: its type and message
                return ANSWER + pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
        finally:
            self.current[k] = -1

    def close(self) -> None:
        for env in self.envs:
            with contextlib.suppress(Exception):  # best effort: the process exits next
                env.close()
        self.block.close()


def _error(exc: BaseException, env: int) -> bytes:
    payload = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc(),
        "env": env,
    }
    return ERROR + pickle.dumps(payload)


def _start(args: WorkerArgs, cmd: Any, res: Any) -> Worker | None:
    make: Callable[[], Any] = pickle.loads(args.factory)
    envs = []
    for g in range(args.lo, args.hi):
        try:
            env = make()
        except Exception as e:
            write_msg(res.fileno(), _error(e, g))
            return None
        if not isinstance(env, gym.Env):
            err = TypeError(f"env_fn must return a gymnasium.Env, got {type(env).__name__}")
            write_msg(res.fileno(), _error(err, g))
            return None
        envs.append(env)
    write_msg(res.fileno(), HELLO + pickle.dumps(describe(envs[0])))
    for g, env in enumerate(envs[1:], args.lo + 1):
        if (env.observation_space, env.action_space) != (
            envs[0].observation_space,
            envs[0].action_space,
        ):
            err = ValueError(f"env {g} has other spaces than env {args.lo}; all envs must match")
            write_msg(res.fileno(), _error(err, g))
            return None
    msg = read_msg(cmd.fileno())
    if msg == QUIT:
        return None
    name, layout = pickle.loads(msg)
    worker = Worker(args, envs, Block(layout, name))
    if args.restart_seeds is not None:
        worker.restart(args.restart_seeds)
    write_msg(res.fileno(), READY)
    return worker


def main(args: WorkerArgs, cmd: Any, res: Any) -> None:
    """The worker process: start, then serve commands until QUIT, a closed pipe or a dead parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    ppid = os.getppid()
    worker = None
    try:
        worker = _start(args, cmd, res)
    except (EOFError, BrokenPipeError):  # the parent went away during startup
        os._exit(1)
    except Exception as e:
        write_msg(res.fileno(), _error(e, -1))
        os._exit(1)
    if worker is None:
        os._exit(1)
    poller = select.poll()
    poller.register(cmd.fileno(), select.POLLIN)
    lo, spin = args.lo, args.spin
    while True:
        if not wait(poller, spin, _PARENT_CHECK_MS):
            if os.getppid() != ppid:
                break
            continue
        try:
            msg = read_msg(cmd.fileno())
        except (EOFError, OSError):
            break
        op = msg[:1]
        if op == QUIT:
            break
        try:
            if op == ALL:
                worker.step(worker.all)
            elif op == STEP:
                worker.step((np.frombuffer(msg, np.int32, offset=1) - lo).tolist())
            elif op == RESET:
                worker.reset(*pickle.loads(msg[1:]))
            elif op not in (CALL, SET):
                raise RuntimeError(f"unknown command {op!r}")
            if op == CALL:
                out = worker.call(*pickle.loads(msg[1:]))
            elif op == SET:
                out = worker.set(*pickle.loads(msg[1:]))
            else:
                out = worker.reply()
        except Exception as e:
            write_msg(res.fileno(), _error(e, int(worker.current[args.index])))
            os._exit(1)
        write_msg(res.fileno(), out)
    worker.close()
