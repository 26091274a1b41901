"""The inference server: every action reaches its env, batching, timeouts, LSTM state, weight
versions, and process actors that are killed and restarted."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from onebox.algos.actor_learner import ServerStats
from onebox.sampling.actor_client import ActorClient
from onebox.sampling.inference import CALL_SECTIONS, InferenceServer

OBS = spaces.Box(-1e6, 1e6, (3,), np.float32)
ACT = spaces.Discrete(1_000_000)


OUTPUTS = {"logprobs": ((), np.float32), "values": ((), np.float32)}


def code_policy(obs: torch.Tensor, actor_ids, env_ids) -> dict[str, torch.Tensor]:
    """Action = 1000 * obs[0] + obs[1]: a known function of each observation."""
    action = (obs[:, 0] * 1000 + obs[:, 1]).long()
    return {"actions": action, "logprobs": -obs[:, 1], "values": 2 * obs[:, 0]}


def observations(actor: int, env_ids: np.ndarray, step: int) -> np.ndarray:
    obs = np.zeros((len(env_ids), 3), np.float32)
    obs[:, 0] = actor * 50 + env_ids
    obs[:, 1] = step
    return obs


def expected(actor: int, env_ids: np.ndarray, step: int) -> np.ndarray:
    return (actor * 50 + env_ids) * 1000 + step


def echo_actor(client: ActorClient, steps: int, num_envs: int) -> None:
    """A process actor checking that each answer is the code of its own env and step."""
    rng = np.random.default_rng(client.actor_id)
    for step in range(steps):
        ids = np.sort(rng.choice(num_envs, rng.integers(1, num_envs + 1), replace=False))
        result = client.infer(observations(client.actor_id, ids, step), ids)
        if not np.array_equal(result.actions, expected(client.actor_id, ids, step)):
            raise AssertionError(f"actor {client.actor_id} step {step}: wrong actions")


def test_concurrent_thread_and_process_actors_each_get_their_own_actions() -> None:
    errors: list[str] = []
    num_envs, steps = 6, 150

    def thread_actor(actor: int) -> None:
        rng = np.random.default_rng(actor)
        for step in range(steps):
            ids = rng.permutation(num_envs)[: rng.integers(1, num_envs + 1)]
            result = server.infer(actor, ids, observations(actor, ids, step), timeout=30)
            if not np.array_equal(result.actions, expected(actor, ids, step)):
                errors.append(f"thread actor {actor} step {step}")
            if not np.array_equal(result.values, 2 * (actor * 50 + ids)):
                errors.append(f"thread actor {actor} step {step}: values")

    with InferenceServer(
        code_policy, OBS, ACT, max_batch=32, timeout_ms=0.5, max_restarts=0, outputs=OUTPUTS
    ) as server:
        for actor in range(3):
            server.spawn(100 + actor, echo_actor, num_envs, args=(steps, num_envs))
        threads = [threading.Thread(target=thread_actor, args=(a,)) for a in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for actor in range(3):
            server.join(100 + actor, timeout=60)
        assert not errors, errors[:5]
        assert server.requests == 11 * steps
        assert server.calls < server.requests  # requests were merged


def test_requests_merge_up_to_max_batch() -> None:
    with InferenceServer(
        code_policy, OBS, ACT, max_batch=4, timeout_ms=1_500, outputs=OUTPUTS
    ) as server:
        ids = np.array([0])
        pending = [server.submit(a, ids, observations(a, ids, 7)) for a in range(4)]
        results = [p.wait(timeout=30) for p in pending]
        assert server.calls == 1  # the batch was full: no waiting for the timeout
        for a, r in enumerate(results):
            assert r.actions.tolist() == expected(a, ids, 7).tolist()
        # Two requests of 3 envs cannot share a batch of 4; the second waits for its timeout.
        ids = np.arange(3)
        pending = [server.submit(a, ids, observations(a, ids, 1)) for a in range(2)]
        first = pending[0].wait(timeout=30)
        assert first.actions.tolist() == expected(0, ids, 1).tolist()
        assert not pending[1].done()
        assert pending[1].wait(timeout=30).actions.tolist() == expected(1, ids, 1).tolist()
        assert server.calls == 3


def test_a_lone_request_is_answered_after_the_timeout() -> None:
    with InferenceServer(
        code_policy, OBS, ACT, max_batch=1000, timeout_ms=20, outputs=OUTPUTS
    ) as server:
        ids = np.array([2, 0])
        result = server.infer(5, ids, observations(5, ids, 3), timeout=30)
        assert result.actions.tolist() == expected(5, ids, 3).tolist()
        assert result.logprobs.tolist() == [-3.0, -3.0]
        assert server.calls == 1


def counting_lstm(obs: torch.Tensor, actor_ids, env_ids, state) -> tuple:
    """h counts the steps since the last reset; c sums obs[0]. The action is that count."""
    h, c = state
    return {"actions": h[:, 0].long()}, (h + 1, c + obs[:, :1])


def test_lstm_state_is_kept_per_actor_and_env_and_reset() -> None:
    with InferenceServer(counting_lstm, OBS, ACT, max_batch=64, timeout_ms=0, lstm=4) as server:
        obs = np.ones((3, 3), np.float32)
        for step in range(3):
            r = server.infer(0, [0, 1, 2], obs)
            assert r.actions.tolist() == [step] * 3
        assert r.state is not None and r.state[0][:, 0].tolist() == [2.0, 2.0, 2.0]
        # Another actor's env 0 has its own state; envs not in a request keep theirs.
        assert server.infer(1, [0], obs[:1]).actions.tolist() == [0]
        assert server.infer(0, [1], obs[:1]).actions.tolist() == [3]
        # A done flag resets that env only, before its observation is used.
        r = server.infer(0, [0, 1, 2], obs, dones=[False, True, False])
        assert r.actions.tolist() == [3, 0, 3]
        assert server.infer(1, [0, 7], obs[:2]).actions.tolist() == [1, 0]
        server.reset_actor(0)
        assert server.infer(0, [0, 1, 2], obs).actions.tolist() == [0, 0, 0]
        assert server.infer(1, [0], obs[:1]).actions.tolist() == [2]


def test_version_counts_weight_updates_and_errors_reach_the_actor() -> None:
    net = torch.nn.Linear(3, 1)

    def policy(obs: torch.Tensor, actor_ids, env_ids) -> dict[str, torch.Tensor]:
        value = net(obs)[:, 0]
        if (obs[:, 2] < 0).any():
            raise FloatingPointError("negative obs")
        return {"actions": torch.zeros(len(obs), dtype=torch.long), "values": value}

    outputs = {"values": ((), np.float32)}
    with InferenceServer(policy, OBS, ACT, max_batch=8, timeout_ms=0, outputs=outputs) as server:
        obs = np.ones((2, 3), np.float32)
        assert server.infer(0, [0, 1], obs).version == 0
        with server.updating():
            net.bias.data.fill_(5.0)
            net.weight.data.zero_()
        r = server.infer(0, [0, 1], obs)
        assert (r.version, r.values.tolist()) == (1, [5.0, 5.0])
        with pytest.raises(RuntimeError, match="FloatingPointError: negative obs"):
            server.infer(0, [0, 1], -obs)
        assert server.infer(0, [0], obs[:1]).version == 1  # the server keeps serving
        with pytest.raises(ValueError, match="obs must have shape"):
            server.submit(0, [0, 1], obs[:1])
        with pytest.raises(ValueError, match="exceeds max_batch"):
            server.submit(0, np.arange(9), np.ones((9, 3), np.float32))
    with pytest.raises(TypeError, match="Discrete or Box actions"):
        InferenceServer(policy, OBS, spaces.MultiBinary(2))


def test_the_calls_split_says_where_their_time_went() -> None:
    # A policy that sleeps holds no core: its calls' time is "policy", the server thread off
    # its core; one that computes for 20 ms of CPU time is "policy" and on a core.
    def sleeping(obs, actor_ids, env_ids):
        time.sleep(0.03)
        return {"actions": torch.zeros(len(obs), dtype=torch.long)}

    def computing(obs, actor_ids, env_ids):
        start = time.thread_time()
        while time.thread_time() - start < 0.02:
            pass
        return {"actions": torch.zeros(len(obs), dtype=torch.long)}

    obs = np.ones((2, 3), np.float32)
    for policy, on_core in ((sleeping, False), (computing, True)):
        with InferenceServer(policy, OBS, ACT, max_batch=8) as server:
            stats = ServerStats(server)
            for _ in range(5):
                server.infer(0, [0, 1], obs, timeout=30)
            charts = stats.update()
            wall, cpu = server.split.totals(), server.split.cpu_totals()
        assert set(wall) == set(cpu) == set(CALL_SECTIONS)
        shares = [charts[f"charts/inference_{k}"] for k in CALL_SECTIONS]
        assert sum(shares) == pytest.approx(1.0) and charts["charts/inference_policy"] > 0.5
        if on_core:
            assert cpu["policy"] >= 5 * 0.02 and charts["charts/inference_on_core"] > 0.5
        else:
            assert wall["policy"] >= 5 * 0.03 and charts["charts/inference_on_core"] < 0.5


def stubborn_actor(client: ActorClient, marker: str, steps: int) -> None:
    """First life: serve forever (to be killed). After a restart: count from a fresh state."""
    first = not os.path.exists(marker)
    Path(marker).touch()
    ids = np.arange(4)
    obs = np.ones((4, 3), np.float32)
    for step in range(10**9 if first else steps):
        result = client.infer(obs, ids)
        if not first and result.actions.tolist() != [step] * 4:
            raise AssertionError(f"restarted actor, step {step}: {result.actions.tolist()}")


def test_a_killed_process_actor_is_restarted_with_a_fresh_state(tmp_path: Path) -> None:
    marker = str(tmp_path / "started")
    with InferenceServer(counting_lstm, OBS, ACT, max_batch=16, timeout_ms=0, lstm=2) as server:
        server.spawn(0, stubborn_actor, 4, args=(marker, 20))
        bystander = tmp_path / "bystander"
        bystander.touch()  # so it counts from a fresh state from its first step
        server.spawn(1, stubborn_actor, 4, args=(str(bystander), 300))
        deadline = time.monotonic() + 60
        # Kill actor 0 only once its first life has begun (marker written) and is serving: a
        # slow process start must not make the restart look like a first life.
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.path.exists(marker)
        served = server.requests
        while server.requests < served + 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.requests >= served + 20
        first_pid = server.pid(0)
        os.kill(first_pid, signal.SIGKILL)
        server.join(0, timeout=60)
        assert server.restarts(0) == 1 and server.pid(0) != first_pid
        server.join(1, timeout=60)
        assert server.restarts(1) == 0


def crashing_actor(client: ActorClient) -> None:
    client.infer(np.ones((1, 3), np.float32))
    raise ValueError("this actor always crashes")


def test_an_actor_crashing_past_max_restarts_fails_with_its_last_words() -> None:
    with InferenceServer(code_policy, OBS, ACT, timeout_ms=0, max_restarts=1, outputs=OUTPUTS) as s:
        s.spawn(0, crashing_actor, 1)
        with pytest.raises(RuntimeError, match=r"(?s)actor 0 is gone for good.*always crashes"):
            s.join(0, timeout=60)
        assert s.restarts(0) == 1 and s.failure(0) is not None


def test_bench_inference_writes_its_section(tmp_path: Path) -> None:
    from onebox import cli

    out = tmp_path / "bench.md"
    args = ["bench", "inference", "--actors", "1", "2", "--max-batch", "64", "--seconds", "1",
            "--warmup", "0.2", "--envs-per-actor", "16", "--output", str(out)]  # fmt: skip
    assert cli.main(args) == 0
    text = out.read_text()
    assert text.startswith("<!-- bench:inference -->")
    rows = [line for line in text.splitlines() if line.startswith(("| thread", "| process"))]
    assert len(rows) == 4 and all("k" in row.split("|")[5] for row in rows)  # env steps/s >= 1k
    assert cli.main([*args[:-2], "--envs-per-actor", "128"]) == 2  # does not fit a batch of 64


def test_padded_batches_are_powers_of_two_and_answer_only_the_requests() -> None:
    # A compiled policy should see few batch sizes: with pad_batches each call's batch is
    # padded with zero rows to the next power of two (at most max_batch), and the padding's
    # outputs are dropped.
    sizes: list[int] = []

    def policy(obs: torch.Tensor, actor_ids, env_ids) -> dict[str, torch.Tensor]:
        sizes.append(len(obs))
        assert len(actor_ids) == len(env_ids) == len(obs)
        return code_policy(obs, actor_ids, env_ids)

    with InferenceServer(policy, OBS, ACT, max_batch=12, timeout_ms=0, outputs=OUTPUTS,
                         pad_batches=True) as server:  # fmt: skip
        for step, n in enumerate((1, 3, 5, 8, 9, 12)):
            ids = np.arange(n)
            result = server.infer(2, ids, observations(2, ids, step))
            assert np.array_equal(result.actions, expected(2, ids, step))
            assert result.values.shape == (n,)
    assert sizes == [1, 4, 8, 8, 12, 12]
    with pytest.raises(ValueError, match="feed-forward"):
        InferenceServer(policy, OBS, ACT, lstm=4, pad_batches=True)
