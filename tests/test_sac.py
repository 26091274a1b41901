"""SAC: the critic target and alpha loss against hand-computed values, actions within the env's
bounds, learning Pendulum (slow), a killed run resumed, eval, and bad configs rejected before any
work."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from learning import kill_and_resume, metric, refused
from onebox import cli, run
from onebox.algos import sac
from onebox.nn.q_networks import SquashedGaussianActor


def test_critic_target_and_alpha_loss() -> None:
    y = sac.critic_target(
        returns=torch.tensor([1.0, -1.0]), discounts=torch.tensor([0.99, 0.0]),
        next_q1=torch.tensor([2.0, 5.0]), next_q2=torch.tensor([3.0, 4.0]),
        next_log_prob=torch.tensor([0.5, 1.0]), alpha=0.2,
    )  # fmt: skip
    assert y.tolist() == pytest.approx([1 + 0.99 * (2 - 0.2 * 0.5), -1.0])
    log_alpha = torch.tensor([math.log(0.5)], requires_grad=True)
    loss = sac.alpha_loss(log_alpha, torch.tensor([-1.0, 0.0]), target_entropy=-1.0)
    assert loss.item() == pytest.approx(-0.5 * (-2 + -1) / 2)  # 0.75
    loss.backward()
    assert log_alpha.grad.item() == pytest.approx(0.75)  # entropy 0.5 > target -1: alpha shrinks


def test_actions_are_rescaled_to_the_bounds() -> None:
    torch.manual_seed(0)
    space = spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))
    actor = SquashedGaussianActor(spaces.Box(-1, 1, (3,), np.float32), space)
    with torch.no_grad():
        actor.mean.weight.zero_()
        actor.mean.bias.zero_()
        action, log_prob, mode = actor.sample(torch.randn(1000, 3) * 10)
    low, high = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 10.0])
    assert ((action >= low) & (action <= high)).all() and log_prob.shape == (1000,)
    assert torch.allclose(mode, torch.tensor([0.0, 5.0]))  # tanh(0) maps to the middle
    assert action[:, 1].min() < 2 and action[:, 1].max() > 8  # the whole range is used


@pytest.mark.slow
def test_pendulum_reaches_minus_250_within_20k_steps(tmp_path: Path) -> None:
    assert cli.main(["train", "sac", "--env", "Pendulum-v1", "--total-steps", "20000",
                     "--runs-dir", str(tmp_path), "--name", "run"]) == 0  # fmt: skip
    returns = [v for _, v in metric(tmp_path / "run", "charts/episodic_return")]
    assert np.mean(returns[-10:]) >= -250


def test_killed_run_resumes_its_counters_and_config_and_evaluates(tmp_path: Path, capsys) -> None:
    run_dir, saved = kill_and_resume(tmp_path, "train", "sac", "--env", "Pendulum-v1",
                                     "--total-steps", "1300", "--learning-starts", "1000",
                                     "--buffer-size", "4000", "--save-replay")  # fmt: skip
    assert 0 < saved < 1300
    state = run.load_checkpoint(run_dir)
    assert state["global_step"] == 1300 and state["trainer"]["updates"] == 300
    assert state["trainer"]["learner"]["updates"] == 300
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["buffer_size"] == 4000 and config["batch_size"] == 256  # preset: 256
    capsys.readouterr()
    assert cli.main(["eval", str(run_dir), "--episodes", "1"]) == 0
    assert "1 episodes" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "CartPole-v1"], "SAC needs continuous"),
        (["--buffer-size", "100"], "smaller than a batch"),
        (["--n-step", "-1"], "--n-step must be positive"),
        (["--policy-frequency", "0"], "--policy-frequency must be positive"),
        (["--q-lrr", "0.1"], "q-lrr"),
    ],
)
def test_bad_config_fails_before_any_work(tmp_path: Path, capsys, args, message) -> None:
    assert message in refused(tmp_path, capsys, "sac", *args)
