"""PQN: Q(lambda) returns against a hand loop, learning CartPole with the default preset (slow),
a killed run resumed, eval, and bad configs rejected before any work."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from learning import kill_and_resume, last_mean, metric, refused
from onebox import cli, run
from onebox.algos import pqn


def test_q_lambda_returns_match_a_hand_loop() -> None:
    torch.manual_seed(0)
    t_len, n, gamma, lam = 6, 3, 0.9, 0.65
    rewards, values = torch.randn(t_len, n), torch.randn(t_len, n)
    ends = torch.rand(t_len, n) < 0.3
    next_value = torch.randn(n)
    got = pqn.q_lambda_returns(rewards, values, ends, next_value, gamma, lam)
    for i in range(n):  # one env at a time, from the definition
        g = [0.0] * t_len
        for t in reversed(range(t_len)):
            if ends[t, i]:
                g[t] = float(rewards[t, i])
            elif t == t_len - 1:
                g[t] = float(rewards[t, i] + gamma * next_value[i])
            else:
                mix = lam * g[t + 1] + (1 - lam) * float(values[t + 1, i])
                g[t] = float(rewards[t, i]) + gamma * mix
        assert got[:, i].tolist() == pytest.approx(g, rel=1e-5, abs=1e-6)
    # lambda 0: one-step Q-learning targets; lambda 1 without ends: discounted sums to the end
    one_step = pqn.q_lambda_returns(rewards, values, ends, next_value, gamma, 0.0)
    nxt = torch.cat([values[1:], next_value[None]])
    assert torch.allclose(one_step, rewards + gamma * (~ends) * nxt)
    no_ends = torch.zeros_like(ends)
    mc = pqn.q_lambda_returns(rewards, values, no_ends, next_value, gamma, 1.0)
    assert float(mc[0, 0]) == pytest.approx(
        sum(gamma**k * float(rewards[k, 0]) for k in range(t_len))
        + gamma**t_len * float(next_value[0]),
        rel=1e-5,
    )


@pytest.mark.slow
def test_default_preset_solves_cartpole(tmp_path: Path) -> None:
    assert cli.main(["train", "pqn", "--env", "CartPole-v1", "--runs-dir", str(tmp_path),
                     "--name", "run"]) == 0  # fmt: skip
    assert last_mean(tmp_path / "run") >= 475


def test_killed_run_resumes_its_counters_and_config_and_evaluates(tmp_path: Path, capsys) -> None:
    run_dir, saved = kill_and_resume(tmp_path, "train", "pqn", "--env", "CartPole-v1",
                                     "--total-steps", "20480")  # fmt: skip
    assert 0 < saved < 20480
    state = run.load_checkpoint(run_dir)
    assert state["global_step"] == 20480 and state["trainer"]["updates"] == 40
    learner = state["trainer"]["learner"]
    assert int(learner["net"]["steps"]) == 20480  # the epsilon schedule's step counter
    assert [s for s, _ in metric(run_dir, "charts/SPS")] == list(range(512, 20481, 512))
    eps = dict(metric(run_dir, "charts/epsilon"))  # 1 -> 0.05 over the first 10240 steps
    assert eps[5120] == pytest.approx(0.525) and eps[20480] == pytest.approx(0.05)
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["preset"] == "classic" and config["q_lambda"] == 0.65
    capsys.readouterr()
    assert cli.main(["eval", str(run_dir), "--episodes", "2"]) == 0
    assert "2 episodes" in capsys.readouterr().out
    assert (run_dir / "curve.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "Pendulum-v1"], "needs Discrete actions"),
        (["--num-minibatches", "3"], "does not divide the batch"),
        (["--q-lambda", "1.5"], "--q-lambda must be in [0, 1]"),
        (["--num-steps", "0"], "--num-steps must be positive"),
        (["--learning-rat", "0.1"], "learning-rat"),
    ],
)
def test_bad_config_fails_before_any_work(tmp_path: Path, capsys, args, message) -> None:
    assert message in refused(tmp_path, capsys, "pqn", *args)


def test_atari_q_network_has_layer_norm_after_every_layer() -> None:
    from gymnasium import spaces

    from onebox.nn.q_networks import QNetwork

    net = QNetwork(spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6), layer_norm=True)
    norms = [m.normalized_shape for m in net.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms == [(32, 20, 20), (64, 9, 9), (64, 7, 7), (512,)]  # CleanRL's pqn_atari
    q = net(torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8))
    assert q.shape == (2, 6)
