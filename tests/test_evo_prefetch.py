"""Parameter rows made ahead of the slots (onebox.evo.prefetch): order, the bound on rows ahead,
errors, and fitnesses equal to those from a table of the same rows."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from onebox.evo.evaluator import PopulationEvaluator
from onebox.evo.prefetch import Prefetch


def test_rows_come_in_queue_order_and_at_most_ahead_are_made() -> None:
    calls: list[int] = []
    made = threading.Semaphore(0)

    def params(idx: np.ndarray) -> torch.Tensor:
        calls.append(int(idx[0]))
        made.release()
        return torch.full((len(idx), 3), float(idx[0]))

    owners = np.array([4, 0, 4, 2, 1, 3])
    pre = Prefetch(params, owners, ahead=2, row_bytes=12, name="test-prefetch")
    try:
        for _ in range(3):  # two rows ahead, and one made while it waits for room
            assert made.acquire(timeout=10)
        assert not made.acquire(timeout=0.3)  # no fourth before a row is taken
        assert calls == [4, 0, 4]
        torch.testing.assert_close(pre.take(2)[:, 0], torch.tensor([4.0, 0.0]))
        torch.testing.assert_close(pre.take(4)[:, 0], torch.tensor([4.0, 2.0, 1.0, 3.0]))
        assert calls == owners.tolist()
    finally:
        pre.close()


def test_rows_ahead_are_capped_by_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("onebox.evo.prefetch.AHEAD_BYTES", 100)
    made = threading.Semaphore(0)

    def params(idx: np.ndarray) -> torch.Tensor:
        made.release()
        return torch.zeros(len(idx), 10)

    pre = Prefetch(params, np.arange(8), ahead=8, row_bytes=40, name="test-prefetch")
    try:
        for _ in range(3):  # 100 bytes hold two rows of 40, and one is in hand
            assert made.acquire(timeout=10)
        assert not made.acquire(timeout=0.3)
    finally:
        pre.close()


def test_a_parameter_function_error_reaches_evaluate() -> None:
    def params(idx: np.ndarray) -> torch.Tensor:
        if idx[0] == 5:
            raise RuntimeError("no weights for individual 5")
        return torch.zeros(len(idx), ev.num_params)

    with PopulationEvaluator("CartPole-v1", num_slots=4, num_threads=1) as ev:
        with pytest.raises(RuntimeError, match="individual 5"):
            ev.evaluate(params, np.ones(8, dtype=np.int64), seed=0)
        ok = ev.evaluate(params, np.ones(4, dtype=np.int64), seed=0)  # usable afterwards
        assert ok.lengths.shape == (4,)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pong-v5"])
def test_a_parameter_function_gives_the_table_fitnesses(env: str) -> None:
    kwargs = {"max_episode_steps": 30, "hidden": (16,)} if env == "Pong-v5" else {}
    with PopulationEvaluator(env, num_slots=4, num_threads=1, **kwargs) as ev:
        table = torch.stack([ev.net.init_params(i) for i in range(6)])
        eps = np.array([1, 2, 1, 1, 2, 1])
        a = ev.evaluate(table, eps, seed=3)
        b = ev.evaluate(lambda idx: table[torch.from_numpy(idx)], eps, seed=3)
    np.testing.assert_array_equal(a.returns, b.returns)
    np.testing.assert_array_equal(a.lengths, b.lengths)
