"""Worker processes started, watched, restarted and stopped in one place: `Supervisor`.

A `Supervisor` starts each worker as `target(*args, *pipe_ends)` in a process of the given
multiprocessing context. The parent keeps the other ends of the worker's pipes (`Worker.conns`,
in the order of `pipes`) and the process's sentinel, so a caller can wait on both at once. Every
worker also gets a "last words" pipe: faulthandler writes a fatal signal's Python trace to it,
and an exception escaping `target` leaves its traceback there, so `reap` can tell a clean exit
from a crash and say why (`Exit`: exit code or signal name, and those last words).

`restart` starts a dead worker again in the same slot (new process, new pipes) and counts it,
up to `max_restarts` per worker and `max_total_restarts` over all of them; past a limit it
raises `RestartLimitError` naming the worker and how it ended; `revive` is the usual policy
(restart a worker that crashed, leave one that exited cleanly). `shutdown` waits a bounded time
for the workers to exit (after the caller has asked them to, in its own protocol), kills the
rest, reaps every one and closes every pipe: it never hangs and leaves no process or pipe behind.

Who uses it: the process env pool (`onebox.envs.process`), whose workers get a command pipe and a
result pipe; A3C (`onebox.algos.a3c`), whose workers get one report pipe; and the inference
server's process actors (`onebox.sampling.inference`), whose workers get a request pipe and a
response pipe: the server thread waits on their pipes and sentinels, `revive`s one that died (a
`RestartLimitError` becomes that actor's failure) and `shutdown(hang_up=True)` stops them.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

TO_WORKER: Literal["to_worker"] = "to_worker"
"""A pipe the parent writes and the worker reads."""
FROM_WORKER: Literal["from_worker"] = "from_worker"
"""A pipe the worker writes and the parent reads."""

CONTEXTS = ("forkserver", "spawn", "fork")
"""The multiprocessing start methods a supervisor takes (where the platform has them)."""

_LAST_WORDS_MAX = 16384
"""Bytes of an escaping traceback written to the last-words pipe (its buffer must not fill)."""


def default_context() -> str:
    """ "forkserver" where the platform has it (safe with threads in the parent), else "spawn"."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def get_context(context: Any) -> Any:
    """A multiprocessing context from its name (None: `default_context()`) or itself."""
    if context is None:
        context = default_context()
    if isinstance(context, multiprocessing.context.BaseContext):
        return context
    if context not in CONTEXTS or context not in multiprocessing.get_all_start_methods():
        raise ValueError(f"context must be one of {CONTEXTS} (available here), got {context!r}")
    return multiprocessing.get_context(context)


class RestartLimitError(RuntimeError):
    """A worker died and may not be restarted again."""


@dataclass(frozen=True)
class Exit:
    """How a worker process ended: its exit code, the signal that killed it, its last words."""

    code: int | None
    """The process's exit code (negative: killed by signal -code)."""
    last_words: str = ""
    """What faulthandler or an escaping exception's traceback left on the last-words pipe."""

    @property
    def clean(self) -> bool:
        """Whether the worker exited with code 0."""
        return self.code == 0

    @property
    def signal(self) -> str | None:
        """The name of the signal that killed the worker (e.g. "SIGKILL"), or None."""
        if self.code is None or self.code >= 0:
            return None
        try:
            return signal.Signals(-self.code).name
        except ValueError:
            return f"signal {-self.code}"

    def describe(self) -> str:
        """ "exited with code N" or "killed by signal SIGX", then the last words if any."""
        sig = self.signal
        how = f"killed by signal {sig}" if sig else f"exited with code {self.code}"
        return how + (f"\nworker last words:\n{self.last_words}" if self.last_words else "")


class Worker:
    """One supervised worker slot: its current process, the parent's ends of its pipes, how often
    it was restarted and how its last process ended. Subclass it to keep per-worker state."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: Any = None
        self.conns: tuple[Any, ...] = ()
        self.restarts = 0
        self.exit: Exit | None = None
        self._words: Any = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the process ends."""
        return self.proc.sentinel

    @property
    def running(self) -> bool:
        """Started and not yet ended."""
        return self.proc is not None and self.proc.pid is not None and self.proc.exitcode is None

    def describe(self, detail: str = "") -> str:
        """ "worker K (pid P)", with `detail` added inside the parentheses."""
        pid = self.pid if self.pid is not None else "?"
        return f"worker {self.index} (pid {pid}{detail})"

    def _close(self) -> None:
        for conn in (*self.conns, self._words):
            if conn is not None:
                conn.close()
        self.conns, self._words = (), None


def _bootstrap(target: Callable[..., Any], words: Any, args: tuple) -> None:
    """A worker process: faulthandler and escaping tracebacks go to the last-words pipe."""
    faulthandler.enable(file=words.fileno(), all_threads=False)
    try:
        target(*args)
    except Exception:
        text = traceback.format_exc().encode(errors="replace")[-_LAST_WORDS_MAX:]
        os.set_blocking(words.fileno(), False)
        with contextlib.suppress(OSError):
            os.write(words.fileno(), text)
        raise


def _read_available(conn: Any) -> str:
    """Whatever bytes a dead worker left in its last-words pipe."""
    fd = conn.fileno()
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:  # BlockingIOError included: nothing more
        pass
    return b"".join(chunks).decode(errors="replace").strip()


class Supervisor:
    """Starts, reaps, restarts and stops worker processes running `target`.

    Args:
        context: a multiprocessing start method ("forkserver", "spawn", "fork"; None: the
            default) or a context object (e.g. torch.multiprocessing's).
        target: the worker's entry point, called as `target(*args, *pipe_ends)`; picklable
            for "spawn" and "forkserver".
        pipes: one direction per pipe (`TO_WORKER`, `FROM_WORKER`); the worker gets its ends
            after `args`, the parent keeps the others in `Worker.conns`.
        name: process name prefix (a worker's process is "{name}-{index}").
        max_restarts: restarts allowed per worker (None: no limit).
        max_total_restarts: restarts allowed over all workers (None: no limit).
        daemon: start the workers as daemonic processes (killed when the parent exits); a
            worker that starts processes of its own cannot be one.
    """

    def __init__(
        self,
        context: Any,
        target: Callable[..., Any],
        *,
        pipes: Sequence[str] = (),
        name: str = "onebox-worker",
        max_restarts: int | None = None,
        max_total_restarts: int | None = None,
        daemon: bool = True,
    ) -> None:
        for direction in pipes:
            if direction not in (TO_WORKER, FROM_WORKER):
                raise ValueError(f"pipe direction must be {TO_WORKER!r} or {FROM_WORKER!r}")
        self.ctx = get_context(context)
        self.target, self.pipes, self.name = target, tuple(pipes), name
        self.max_restarts, self.max_total_restarts = max_restarts, max_total_restarts
        self.daemon = daemon
        self.workers: list[Worker] = []
        self.restarts = 0
        """Restarts so far, over all workers."""

    def add(self, worker: Worker, *args: Any) -> Worker:
        """Supervise `worker` (a new slot) and start its process with `args`."""
        self.workers.append(worker)
        self.start(worker, *args)
        return worker

    def start(self, worker: Worker, *args: Any) -> None:
        """Start a process in `worker`'s slot (its previous one, if any, must be reaped)."""
        ends, child = [], []
        for direction in self.pipes:
            r, w = self.ctx.Pipe(duplex=False)
            ends.append(w if direction == TO_WORKER else r)
            child.append(r if direction == TO_WORKER else w)
        words_r, words_w = self.ctx.Pipe(duplex=False)
        worker.proc = self.ctx.Process(
            target=_bootstrap,
            args=(self.target, words_w, (*args, *child)),
            name=f"{self.name}-{worker.index}",
            daemon=self.daemon,
        )
        worker.conns, worker._words, worker.exit = tuple(ends), words_r, None
        try:
            worker.proc.start()
        finally:  # the worker holds the only other ends: its death closes the pipes
            for conn in (*child, words_w):
                conn.close()

    def wait(self, conns: Sequence[Any] = (), timeout: float | None = None) -> list[Any]:
        """Wait up to `timeout` s for any of `conns` to be readable or a worker to end; the ready
        ones (connections, and the `Worker`s whose process ended and was not reaped yet)."""
        by_fd = {w.sentinel: w for w in self.workers if w.exit is None and w.pid is not None}
        ready = multiprocessing.connection.wait([*conns, *by_fd], timeout)
        return [by_fd.get(r, r) if isinstance(r, int) else r for r in ready]

    def readable(self, worker: Worker, conn: Any) -> bool:
        """Wait until `conn` is readable (True: data, or end of file once the worker's end is
        closed) or `worker`'s process ended with `conn` not readable (False)."""
        while True:
            if conn.poll(0):
                return True
            ready = multiprocessing.connection.wait([conn, worker.sentinel])
            if ready == [worker.sentinel] and not conn.poll(0):
                return False

    def reap(self, worker: Worker, timeout: float = 5.0) -> Exit:
        """How `worker`'s process ended, after waiting up to `timeout` s for it to (it is killed
        after that); its pipes stay open so that the caller can read what is left in them."""
        if worker.exit is not None:
            return worker.exit
        worker.proc.join(timeout)
        if worker.proc.exitcode is None:
            worker.proc.kill()
            worker.proc.join()
        words = _read_available(worker._words) if worker._words is not None else ""
        worker.exit = Exit(worker.proc.exitcode, words)
        return worker.exit

    def restart(self, worker: Worker, *args: Any) -> None:
        """Start `worker` again with `args` after its process ended (it is reaped first), or
        raise `RestartLimitError` if a restart limit is reached."""
        ended = self.reap(worker)
        limits = ((worker.restarts, self.max_restarts, "per worker"),
                  (self.restarts, self.max_total_restarts, "in all"))  # fmt: skip
        for done, limit, scope in limits:
            if limit is not None and done >= limit:
                raise RestartLimitError(
                    f"{worker.describe()} {ended.describe()}\nafter {done} restarts "
                    f"(limit {limit} {scope})"
                )
        worker._close()
        worker.restarts += 1
        self.restarts += 1
        self.start(worker, *args)

    def revive(self, worker: Worker, *args: Any) -> Exit:
        """The restart policy for a worker whose process ended: reap it and, if it crashed,
        `restart` it with `args` (limits apply); a clean exit stays ended. How it ended."""
        ended = self.reap(worker)
        if not ended.clean:
            self.restart(worker, *args)
        return ended

    def shutdown(
        self, timeout: float = 2.0, drain: Callable[[], Any] | None = None, hang_up: bool = False
    ) -> None:
        """Wait up to `timeout` s for every worker to exit (the caller asks them to first, or
        `hang_up` closes the parent's pipe ends first, for workers that stop at end of file;
        under "fork" a worker also holds the ends of those started before it, so those see no
        end of file until it exits),
        calling `drain()` meanwhile (to read pipes a worker may be blocked writing to); kill the
        rest, reap all, call `drain()` once more and close every pipe. Safe to call twice."""
        if hang_up:
            for w in self.workers:
                for conn in w.conns:
                    conn.close()
        deadline = time.monotonic() + timeout
        while (live := [w for w in self.workers if w.running]) and (
            left := deadline - time.monotonic()
        ) > 0:
            if drain is not None:
                drain()
            multiprocessing.connection.wait(
                [w.sentinel for w in live], min(left, 0.05) if drain else left
            )
        for w in self.workers:
            if w.running:
                w.proc.kill()
        for w in self.workers:
            if w.proc is not None and w.proc.pid is not None:
                self.reap(w)
        if drain is not None:
            drain()
        for w in self.workers:
            w._close()
