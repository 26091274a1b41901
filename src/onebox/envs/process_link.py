"""The process env pool's side of its worker processes: `WorkerLink`.

It starts the workers under a `Supervisor` and takes them through the startup handshake (HELLO
with the envs' spaces, then the shared-memory block, then READY), sends them commands, waits for
their replies and their deaths at once (a poller on the result pipes and the process sentinels),
and handles a worker that raised or died: the pool fails, or with `restart_on_crash` the worker is
restarted with fresh seeds and its pending commands are sent again. What a reply means is the
pool's business (`on_result`).
"""

from __future__ import annotations

import collections
import pickle
import select
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from onebox.envs import process_worker as pw
from onebox.envs.process_shared import MAX_INFO_KEYS
from onebox.envs.shm import Block
from onebox.supervisor import FROM_WORKER, TO_WORKER, Supervisor, Worker


class Proc(Worker):
    """One worker process (supervised), its pipes and the commands it has not answered yet."""

    def __init__(self, index: int, lo: int, hi: int) -> None:
        super().__init__(index)
        self.lo, self.hi = lo, hi
        self.ids = np.arange(lo, hi, dtype=np.int32)
        self.pending: collections.deque[tuple[np.ndarray, bytes]] = collections.deque()
        self.slots: dict[int, str] = {}  # info slot -> key
        self.kinds: dict[int, str] = {}  # info slot -> "i" or "f"
        self.fresh = False  # restarted and has not completed a command since
        self.answer: tuple[bool, Any] | None = None  # the reply to CALL or SET

    @property
    def cmd(self) -> Any:
        return self.conns[0]

    @property
    def res(self) -> Any:
        return self.conns[1]

    def describe(self) -> str:
        return super().describe(f", envs {self.lo}..{self.hi - 1}")


def shutdown(sup: Supervisor, blocks: list[Block]) -> None:
    """Stop every worker (politely, then by force) and free the shared memory."""
    for p in sup.workers:
        try:
            if p.conns:
                pw.write_msg(p.conns[0].fileno(), pw.QUIT)
        except OSError:
            pass
    sup.shutdown(timeout=2)
    for block in blocks:
        block.close(unlink=True)
    blocks.clear()


class WorkerLink:
    """Starts, talks to and restarts the workers `procs` of one pool.

    Args:
        ctx: the multiprocessing context.
        procs: the workers, each hosting envs `lo..hi-1`.
        factory: the cloudpickled env factory.
        env_name: the env's name, for messages.
        seed: the pool's base seed (restarted workers' seeds derive from it).
        same_step: same-step autoreset.
        spin: seconds to poll before sleeping (parent and workers).
        restart_on_crash: restart a worker that raised or died instead of failing.
        on_result: `(worker, env ids, reply)` for each completed step or reset command.
        fail: makes the pool unusable and raises `RuntimeError(text)`.

    The two callbacks are the pool's methods, held weakly: a pool nobody holds is collected (and
    its workers stopped by its finalizer) as soon as it is dropped.
    """

    def __init__(
        self,
        ctx: Any,
        procs: list[Proc],
        *,
        factory: bytes,
        env_name: str,
        seed: int,
        same_step: bool,
        spin: float,
        restart_on_crash: bool,
        on_result: Callable[[Proc, np.ndarray, bytes], None],
        fail: Callable[[str], NoReturn],
    ) -> None:
        self.ctx, self.procs = ctx, procs
        self.sup = Supervisor(
            ctx, pw.main, pipes=(TO_WORKER, FROM_WORKER), name="onebox-env-worker"
        )
        self.factory, self.env_name, self.seed = factory, env_name, seed
        self.same_step, self.spin, self.restart_on_crash = same_step, spin, restart_on_crash
        self._on_result = weakref.WeakMethod(on_result)  # type: ignore[arg-type]
        self._fail = weakref.WeakMethod(fail)  # type: ignore[arg-type]
        self.block: Block | None = None
        self.current: np.ndarray | None = None  # each worker's env being stepped (-1: idle)
        self.spaces: tuple[Any, Any] | None = None  # the envs' observation and action spaces
        self._poller = select.poll()
        self._fds: dict[int, tuple[Proc, bool]] = {}

    # ---- startup -------------------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        """Start every worker and return worker 0's HELLO (spaces, metadata, spec); raise if one
        fails to start or makes envs with other spaces."""
        for p in self.procs:
            self.sup.add(p, self._args(p, None))
        hello = [pickle.loads(self._handshake_reply(p, pw.HELLO)) for p in self.procs]
        first = hello[0]
        self.spaces = (first["observation_space"], first["action_space"])
        for p, h in zip(self.procs[1:], hello[1:], strict=True):
            if (h["observation_space"], h["action_space"]) != self.spaces:
                raise ValueError(
                    f"{p.describe()} made envs with other spaces than worker 0; all envs must match"
                )
        return first

    def attach(self, block: Block, current: np.ndarray) -> None:
        """Hand every worker the shared-memory block, wait until all are READY, watch them.
        `current`: the block's array of each worker's env being stepped."""
        self.block, self.current = block, current
        for p in self.procs:
            pw.write_msg(p.cmd.fileno(), pickle.dumps((block.name, block.layout)))
        for p in self.procs:
            self._handshake_reply(p, pw.READY)
            self._watch(p)

    def _args(self, p: Proc, restart_seeds: list[int] | None) -> pw.WorkerArgs:
        return pw.WorkerArgs(
            index=p.index,
            lo=p.lo,
            hi=p.hi,
            factory=self.factory,
            same_step=self.same_step,
            max_info_keys=MAX_INFO_KEYS,
            restart_seeds=restart_seeds,
            slots={key: (slot, p.kinds[slot]) for slot, key in p.slots.items()},
            spin=self.spin,
        )

    def _handshake_reply(self, p: Proc, expect: bytes) -> bytes:
        """Wait for worker p's next startup message; raise if it failed or died."""
        msg = self._wait_message(p)
        if msg is None or msg[:1] == pw.ERROR:
            raise self._startup_error(p, msg)
        if msg[:1] != expect:
            raise RuntimeError(f"{p.describe()} sent {msg[:1]!r} during startup, not {expect!r}")
        return msg[1:]

    def _wait_message(self, p: Proc) -> bytes | None:
        """The next message from worker p, or None if it died first."""
        if not self.sup.readable(p, p.res):
            return None
        try:
            return pw.read_msg(p.res.fileno())
        except (EOFError, OSError):
            return None

    def _startup_error(self, p: Proc, msg: bytes | None) -> Exception:
        if msg is None:
            hint = (
                ""
                if self.ctx.get_start_method() == "fork"
                else "\n(the 'spawn' and 'forkserver' contexts import the main module again in each "
                "worker: make the pool under `if __name__ == '__main__':`, or pass context='fork')"
            )
            return RuntimeError(
                f"{p.describe()} of {self.env_name} died while starting: "
                f"{self.sup.reap(p).describe()}{hint}"
            )
        err = pickle.loads(msg[1:])
        text = (
            f"{p.describe()} could not start {self.env_name}: {err['type']}: {err['message']}\n"
            f"worker traceback:\n{err['traceback']}"
        )
        if err["type"] in ("TypeError", "ValueError"):  # bad arguments: the user's to fix
            return (TypeError if err["type"] == "TypeError" else ValueError)(text)
        return RuntimeError(text)

    def _watch(self, p: Proc) -> None:
        for fd, is_sentinel in ((p.res.fileno(), False), (p.sentinel, True)):
            self._poller.register(fd, select.POLLIN)
            self._fds[fd] = (p, is_sentinel)

    def _unwatch(self, p: Proc) -> None:
        for fd in (p.res.fileno(), p.sentinel):
            if self._fds.pop(fd, None) is not None:
                self._poller.unregister(fd)

    # ---- messages ------------------------------------------------------------------------------

    def send(self, p: Proc, ids: np.ndarray, msg: bytes) -> None:
        """Send command `msg` (about envs `ids`) to worker p."""
        p.pending.append((ids, msg))
        try:
            pw.write_msg(p.cmd.fileno(), msg)
        except OSError:  # the worker is gone: _crash restarts it and resends what is pending
            self._crash(p, self._wait_message(p))

    def pump(self) -> None:
        """Wait for the next event from any worker and handle it."""
        for fd, _ in pw.wait(self._poller, self.spin, None):
            entry = self._fds.get(fd)
            if entry is None:
                continue
            p, is_sentinel = entry
            if is_sentinel and p.res.poll(0):
                continue  # read its last messages first; the sentinel stays ready
            try:
                msg = None if is_sentinel else pw.read_msg(p.res.fileno())
            except (EOFError, OSError):
                msg = None
            if msg is None or msg[:1] == pw.ERROR:
                self._crash(p, msg)
                return  # fds may have been reused by a restarted worker: poll again
            self._done(p, msg)

    def _done(self, p: Proc, msg: bytes) -> None:
        ids, _ = p.pending.popleft()
        p.fresh = False
        if msg[:1] == pw.ANSWER:
            p.answer = pickle.loads(msg[1:])
            return
        self._on_result()(p, ids, msg)  # type: ignore[misc]

    def wait_idle(self) -> None:
        """Wait until every worker has answered every command sent."""
        while any(p.pending for p in self.procs):
            self.pump()

    # ---- crashes -------------------------------------------------------------------------------

    def _crash(self, p: Proc, msg: bytes | None) -> None:
        """Worker p raised (msg is its ERROR) or died (msg None): restart it or fail."""
        if msg is not None and msg[:1] == pw.ERROR:
            err = pickle.loads(msg[1:])
            env, how = err["env"], f"raised {err['type']}: {err['message']}"
            detail = f"worker traceback:\n{err['traceback']}"
            self.sup.reap(p)
        else:
            assert self.current is not None
            env = int(self.current[p.index])
            how, detail = "died", self.sup.reap(p).describe()
        where = f"env {env} ({self.env_name})" if env >= 0 else f"{self.env_name} (idle)"
        text = f"{where} in {p.describe()} {how}\n{detail}".rstrip()
        if not self.restart_on_crash or p.fresh:
            again = " again right after a restart" if p.fresh else ""
            self._fail()(f"{where} in {p.describe()} {how}{again}\n{detail}".rstrip())
        self._restart(p, text)

    def _restart(self, p: Proc, why: str) -> None:
        assert self.block is not None
        self._unwatch(p)
        count = p.restarts + 1
        seeds = [
            int(np.random.SeedSequence([self.seed, g, count]).generate_state(1, np.uint64)[0])
            for g in range(p.lo, p.hi)
        ]
        self.sup.restart(p, self._args(p, seeds))
        try:
            hello = pickle.loads(self._handshake_reply(p, pw.HELLO))
            pw.write_msg(p.cmd.fileno(), pickle.dumps((self.block.name, self.block.layout)))
            self._handshake_reply(p, pw.READY)
        except Exception as e:
            self._fail()(f"{p.describe()} could not be restarted after a crash ({e})\n{why}")
        if (hello["observation_space"], hello["action_space"]) != self.spaces:
            self._fail()(f"{p.describe()} came back with other spaces after a restart")
        self._watch(p)
        p.fresh = True
        for _, msg in p.pending:
            pw.write_msg(p.cmd.fileno(), msg)
