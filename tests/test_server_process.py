"""The inference server in a process of its own: its actors get the learner's policy and, once
published, the learner's new weights; a killed actor is restarted there; a dead server process
is reported with how it ended, its actors go with it; APPO runs and resumes with it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from learning import best_window, descendants, metric, refused, start_until_checkpoint
from onebox import cli, run
from onebox.sampling.actor_client import ActorClient
from onebox.sampling.policies import SharedWeights
from onebox.sampling.server_process import ServerProcess

APPO = ("train", "appo", "--env", "CartPole-v1", "--actors", "2", "--envs-per-actor", "4",
        "--batch-unrolls", "1", "--process-actors", "--server-process")  # fmt: skip
"""A small APPO run with its server in a process of its own (batches of one 32-step unroll, 16
optimizer steps each: the run lasts long enough to be killed in its middle)."""

OBS = spaces.Box(-1e6, 1e6, (3,), np.float32)
ACT = spaces.Discrete(1_000_000)


def reporting_actor(client: ActorClient, report: str, until: int) -> None:
    """Ask for actions until the weights' version reaches `until`, appending each new (pid,
    version, actions) to the file `report` as a line (an append of one short line is atomic: a
    reader never sees half of one, and a killed actor holds no lock that its next life needs)."""
    ids, obs, last = np.arange(2), np.ones((2, 3), np.float32), None
    fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        while True:
            r = client.infer(obs, ids)
            now = (r.version, r.actions.tolist())
            if now != last:
                os.write(fd, json.dumps([os.getpid(), *now]).encode() + b"\n")
                last = now
            if r.version >= until:
                return
            time.sleep(0.01)
    finally:
        os.close(fd)


def reported(report: Path, count: int) -> list[list]:
    """The first `count` lines of `report` (waiting up to a minute for them)."""
    deadline = time.monotonic() + 60
    while True:
        lines = report.read_text().splitlines() if report.exists() else []
        if len(lines) >= count:
            return [json.loads(line) for line in lines[:count]]
        assert time.monotonic() < deadline, f"{len(lines)} of {count} reports: {lines}"
        time.sleep(0.02)


def linear_server(
    bias: float, processes: int = 1
) -> tuple[ServerProcess, torch.nn.Linear, SharedWeights]:
    """Server processes whose policy's action is its network's output, `bias` at first."""
    net = torch.nn.Linear(3, 1)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.fill_(bias)

    def policy(obs: torch.Tensor, actor_ids, env_ids) -> dict[str, torch.Tensor]:
        return {"actions": net(obs)[:, 0].round().long()}

    weights = SharedWeights.create(net, 0)
    return (
        ServerProcess(net, policy, weights, OBS, ACT, max_batch=8, processes=processes),
        net,
        weights,
    )


def gone(pid: int, within: float = 20.0) -> bool:
    """Whether process `pid` has ended (or is a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1][0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_actors_get_the_learners_policy_then_its_published_weights(tmp_path: Path) -> None:
    server, net, weights = linear_server(2.0)
    report = tmp_path / "report"
    try:
        server.spawn(0, reporting_actor, 2, (str(report), 1))
        with pytest.raises(ValueError, match="already has a process"):
            server.spawn(0, reporting_actor, 2, (str(report), 1))
        server.start()
        with pytest.raises(RuntimeError, match=r"before ServerProcess\.start"):
            server.spawn(1, reporting_actor, 2, (str(report), 1))
        assert reported(report, 1)[0][1:] == [0, [2, 2]]
        with server.updating(), torch.no_grad():
            net.bias.fill_(5.0)
        assert server.version == 1
        weights.publish(net, server.version)
        assert reported(report, 2)[1][1:] == [1, [5, 5]]
        counters = server.counters()
        assert counters["calls"] >= 2 and counters["env_steps"] == 2 * counters["calls"]
        assert server.failure(0) is None and server.restarts(0) == 0
    finally:
        server.close()
        weights.close(unlink=True)


def test_two_server_processes_each_serve_half_the_actors(tmp_path: Path) -> None:
    server, net, weights = linear_server(2.0, processes=2)
    reports = [tmp_path / f"report{a}" for a in range(3)]
    try:
        for a, report in enumerate(reports):
            server.spawn(a, reporting_actor, 2, (str(report), 10**9))
        server.start()
        assert [reported(r, 1)[0][1:] for r in reports] == [[0, [2, 2]]] * 3
        with server.updating(), torch.no_grad():
            net.bias.fill_(7.0)
        weights.publish(net, server.version)
        assert [reported(r, 2)[1][1:] for r in reports] == [[1, [7, 7]]] * 3
        counters = server.counters()  # summed over both
        assert counters["servers"] == 2 and counters["env_steps"] >= 2 * counters["calls"]
        assert counters["calls"] >= 4 and set(counters["split"]) == set(counters["split_cpu"])
        pids = server.server_pids
        assert len(set(pids)) == 2
        # Actors 0 and 2 are the first server's children, actor 1 the second's.
        for a, parent in ((0, pids[0]), (1, pids[1]), (2, pids[0])):
            assert parent in ancestors(server.pid(a))
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(RuntimeError, match="server process 2 of 2 killed by signal SIGKILL"):
            server.counters()
    finally:
        server.close()
        weights.close(unlink=True)


def test_more_server_processes_than_actors_are_refused() -> None:
    server, _, weights = linear_server(0.0, processes=2)
    try:
        server.spawn(0, reporting_actor, 2, ("unused", 1))
        with pytest.raises(ValueError, match="2 server processes for 1 process actor"):
            server.start()
    finally:
        server.close()
        weights.close(unlink=True)


def ancestors(pid: int) -> list[int]:
    """The pids above `pid`, its parent first."""
    out = []
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(") ", 1)[1].split()[1])
        out.append(pid)
    return out


def test_a_policy_that_does_not_pickle_is_refused_with_what_to_do() -> None:
    net, lock = torch.nn.Linear(3, 1), threading.Lock()

    def policy(obs: torch.Tensor, actor_ids, env_ids) -> dict[str, torch.Tensor]:
        with lock:
            return {"actions": net(obs)[:, 0].long()}

    weights = SharedWeights.create(net, 0)
    try:
        with pytest.raises(TypeError, match="not over a lock, a file or the learner"):
            ServerProcess(net, policy, weights, OBS, ACT)
    finally:
        weights.close(unlink=True)


def test_a_killed_actor_is_restarted_and_a_killed_server_is_reported(tmp_path: Path) -> None:
    server, _, weights = linear_server(3.0)
    report = tmp_path / "report"
    try:
        server.spawn(0, reporting_actor, 2, (str(report), 10**9))
        server.start()
        first = server.pid(0)
        assert reported(report, 1)[0] == [first, 0, [3, 3]]
        os.kill(first, signal.SIGKILL)
        second = reported(report, 2)[1]  # its next life reports afresh
        assert second[0] != first and second[1:] == [0, [3, 3]]
        assert server.restarts(0) == 1 and server.pid(0) == second[0]
        [server_pid] = server.server_pids
        assert server_pid is not None
        os.kill(server_pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="inference server process killed by signal SIGKILL"):
            server.counters()
        assert gone(second[0])  # its actors end with it (their pipes close)
    finally:
        server.close()
        weights.close(unlink=True)


def test_a_killed_appo_run_leaves_no_process_and_resumes_with_its_server_process(
    tmp_path: Path,
) -> None:
    proc, run_dir = start_until_checkpoint(tmp_path, *APPO, "--total-steps", "4000")
    time.sleep(0.5)
    # The server process and, below it, the two actors (each process's forkserver between).
    below = descendants(proc.pid)
    assert sorted(below.values()).count(4) == 2, below
    proc.kill()
    proc.wait()
    assert all(gone(pid) for pid in below), "processes outlived the killed learner"
    log = (run_dir / "log.txt").read_text()
    assert "the server in a process of its own" in log
    saved = run.load_checkpoint(run_dir)["global_step"]
    assert 0 < saved < 4000
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    assert run.load_checkpoint(run_dir)["global_step"] == 4000
    tags = {
        tag for tag in ("charts/inference_on_core", "charts/policy_lag") if metric(run_dir, tag)
    }
    assert tags == {"charts/inference_on_core", "charts/policy_lag"}


def test_a_run_whose_server_process_dies_stops_and_says_why(tmp_path: Path) -> None:
    proc, run_dir = start_until_checkpoint(tmp_path, *APPO, "--total-steps", "10000000")
    below = descendants(proc.pid)
    servers = [pid for pid, depth in below.items() if depth == 2]
    assert len(servers) == 1, below
    os.kill(servers[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode not in (0, None)
    assert "the inference server process killed by signal SIGKILL" in out
    assert all(gone(pid) for pid in below)
    assert run.load_checkpoint(run_dir)["global_step"] > 0


@pytest.mark.slow  # about 40 s on a 2-core machine
def test_appo_learns_cartpole_with_its_server_in_a_process_of_its_own(tmp_path: Path) -> None:
    # As APPO's in-process CartPole test asks (random play: ~22); seeds 1 and 2 reached 500.
    assert cli.main(["train", "appo", "--env", "CartPole-v1", "--total-steps", "60000",
                     "--process-actors", "--server-process", "--runs-dir", str(tmp_path),
                     "--name", "run"]) == 0  # fmt: skip
    assert best_window(tmp_path / "run") >= 475
    assert min(v for _, v in metric(tmp_path / "run", "charts/policy_lag")) >= 0


def test_server_process_needs_process_actors(tmp_path: Path, capsys) -> None:
    err = refused(tmp_path, capsys, "appo", "--env", "CartPole-v1", "--server-process")
    assert "--server-process runs the inference server beside process actors" in err


def test_server_processes_need_the_server_process_and_an_actor_each(tmp_path: Path, capsys):
    err = refused(tmp_path, capsys, "appo", "--env", "CartPole-v1", "--process-actors",
                  "--server-processes", "2")  # fmt: skip
    assert "--server-processes is how many processes --server-process runs" in err
    err = refused(tmp_path, capsys, *APPO[1:], "--server-processes", "3")
    assert "--server-processes must be an integer from 1 to --actors (2)" in err


def test_an_appo_run_with_two_server_processes(tmp_path: Path) -> None:
    assert cli.main([*APPO, "--server-processes", "2", "--total-steps", "4000", "--runs-dir",
                     str(tmp_path), "--name", "two"]) == 0  # fmt: skip
    log = (tmp_path / "two" / "log.txt").read_text()
    assert "2 servers, each in a process of its own with 1 actor in 2" in log
    assert run.load_checkpoint(tmp_path / "two")["global_step"] == 4000
    busy = metric(tmp_path / "two", "charts/inference_busy")
    assert busy and all(0 < v <= 1 for _, v in busy)
