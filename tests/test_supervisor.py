"""The worker-process supervisor: clean exits, crashes, signals, restarts, bounded shutdown."""

from __future__ import annotations

import os
import signal
import time

import pytest

from learning import alive
from onebox.supervisor import (
    FROM_WORKER,
    TO_WORKER,
    RestartLimitError,
    Supervisor,
    Worker,
    get_context,
)


def echo(tag: str, cmd, res) -> None:
    """Reply `tag` and what the parent sent, then exit cleanly."""
    res.send((tag, cmd.recv()))


def fail(message: str, res) -> None:
    raise ValueError(message)


def until_eof(cmd, res) -> None:
    """Serve until the parent hangs up."""
    try:
        while True:
            res.send(cmd.recv())
    except EOFError:
        pass


def sleep_forever(res) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL stops it
    res.send(os.getpid())
    while True:
        time.sleep(1)


def test_a_clean_exit_is_clean_and_pipes_carry_both_ways():
    sup = Supervisor("forkserver", echo, pipes=(TO_WORKER, FROM_WORKER))
    w = sup.add(Worker(0), "hi")
    cmd, res = w.conns
    cmd.send(42)
    assert sup.readable(w, res) and res.recv() == ("hi", 42)
    assert sup.wait(timeout=10) == [w]  # its sentinel
    ended = sup.reap(w)
    assert ended.clean and ended.signal is None and ended.last_words == ""
    assert ended.describe() == "exited with code 0"
    with pytest.raises(EOFError):  # ended: its end of the pipe is closed
        res.recv()
    sup.shutdown()
    assert not alive(w.pid) and w.conns == ()


def test_an_exception_is_a_crash_with_its_traceback():
    sup = Supervisor("forkserver", fail, pipes=(FROM_WORKER,))
    w = sup.add(Worker(3), "bad config value")
    ended = sup.reap(w, timeout=10)
    assert not ended.clean and ended.code == 1 and ended.signal is None
    assert "ValueError: bad config value" in ended.last_words
    assert "in fail" in ended.last_words  # the worker's traceback
    assert ended.describe().startswith("exited with code 1\nworker last words:\nTraceback")
    sup.shutdown()


def test_a_sigkill_is_named_and_restarts_stop_at_the_limit():
    sup = Supervisor("fork", sleep_forever, pipes=(FROM_WORKER,), max_restarts=2)
    w = sup.add(Worker(0))
    pids = []
    for k in range(3):
        pids.append(w.conns[0].recv())
        assert w.pid == pids[-1] and w.restarts == k == sup.restarts
        os.kill(w.pid, signal.SIGKILL)
        assert sup.wait(timeout=10) == [w]
        ended = sup.reap(w)
        assert ended.signal == "SIGKILL" and ended.describe() == "killed by signal SIGKILL"
        if k < 2:
            sup.restart(w)

    with pytest.raises(RestartLimitError, match=r"worker 0 .* killed by signal SIGKILL\n"
                       r"after 2 restarts \(limit 2 per worker\)"):  # fmt: skip
        sup.restart(w)
    assert len(set(pids)) == 3
    sup.shutdown()
    assert not any(alive(pid) for pid in pids)


def test_revive_restarts_a_crash_and_leaves_a_clean_exit():
    crashing = Supervisor("fork", fail, pipes=(FROM_WORKER,), max_restarts=1)
    w = crashing.add(Worker(0), "boom")
    first = w.pid
    assert "ValueError: boom" in crashing.revive(w, "boom").last_words
    assert w.restarts == 1 and w.pid != first and w.exit is None  # running again
    with pytest.raises(RestartLimitError, match="ValueError: boom"):
        crashing.revive(w, "boom")
    crashing.shutdown()

    clean = Supervisor("fork", echo, pipes=(TO_WORKER, FROM_WORKER))
    w = clean.add(Worker(0), "bye")
    w.conns[0].send(None)
    assert clean.revive(w).clean and w.restarts == 0 and not w.running
    clean.shutdown()


def test_the_total_restart_limit_counts_every_worker():
    sup = Supervisor("fork", sleep_forever, pipes=(FROM_WORKER,), max_total_restarts=1)
    a, b = sup.add(Worker(0)), sup.add(Worker(1))
    for w in (a, b):
        w.conns[0].recv()
        os.kill(w.pid, signal.SIGKILL)
    sup.restart(a)
    with pytest.raises(RestartLimitError, match=r"worker 1 .*\nafter 1 restarts \(limit 1 in all"):
        sup.restart(b)
    sup.shutdown(timeout=0)


def test_shutdown_kills_hung_workers_within_its_timeout_and_leaks_nothing():
    sup = Supervisor("forkserver", sleep_forever, pipes=(FROM_WORKER,))
    workers = [sup.add(Worker(k)) for k in range(3)]
    pids = [w.conns[0].recv() for w in workers]
    conns = [w.conns[0] for w in workers]
    start = time.monotonic()
    sup.shutdown(timeout=0.5)
    assert time.monotonic() - start < 10  # bounded: the hung workers were killed, not awaited
    assert not any(alive(pid) for pid in pids)
    assert all(w.exit is not None and w.exit.signal == "SIGKILL" for w in workers)
    assert all(c.closed for c in conns) and all(w.conns == () for w in workers)
    sup.shutdown()  # twice is fine


def test_shutdown_drains_pipes_while_waiting():
    got = []
    sup = Supervisor("fork", echo, pipes=(TO_WORKER, FROM_WORKER))
    w = sup.add(Worker(0), "last")
    res = w.conns[1]
    w.conns[0].send("report")

    def drain() -> None:
        try:
            while not res.closed and res.poll():
                got.append(res.recv())
        except EOFError:  # the worker is gone and its pipe empty
            pass

    sup.shutdown(timeout=10, drain=drain)
    assert got == [("last", "report")] and w.exit.clean


def test_hang_up_lets_workers_that_stop_at_end_of_file_exit_cleanly():
    # forkserver: a forked worker would inherit the parent's ends of earlier workers' pipes
    sup = Supervisor("forkserver", until_eof, pipes=(TO_WORKER, FROM_WORKER))
    workers = [sup.add(Worker(k)) for k in range(2)]
    for w in workers:
        w.conns[0].send(w.index)
        assert w.conns[1].recv() == w.index
    sup.shutdown(timeout=10, hang_up=True)
    assert all(w.exit is not None and w.exit.clean for w in workers)  # not killed


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="context must be one of"):
        get_context("threads")
    with pytest.raises(ValueError, match="pipe direction"):
        Supervisor("fork", echo, pipes=("both",))
