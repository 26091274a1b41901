"""DQN: targets and the dueling aggregation against hand-computed values, n-step discounts used
from the buffer, learning CartPole with the default preset (slow), a killed run resumed, eval,
Atari with frame-deduplicated replay, and bad configs rejected before any work."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from learning import kill_and_resume, last_mean, metric, refused
from onebox import cli, run
from onebox.algos import dqn
from onebox.nn.q_networks import QNetwork, dueling_q
from onebox.replay import ReplayBuffer

SPACES = (spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(2))
CONFIG = dataclasses.replace(dqn.Config(), total_steps=100, learning_rate=2.5e-4, end_e=0.1,
                             exploration_fraction=0.5, target_network_frequency=10,
                             train_frequency=1)  # fmt: skip
"""A DQN config with what its learner reads set (as its preset would)."""


def test_td_target_of_dqn_and_double_dqn() -> None:
    returns, discounts = torch.tensor([1.0, 2.0]), torch.tensor([0.99, 0.0])
    next_target = torch.tensor([[1.0, 3.0], [5.0, 2.0]])
    assert dqn.td_target(returns, discounts, next_target).tolist() == pytest.approx([3.97, 2.0])
    # double DQN: the online net picks actions 0 and 1, the target net values them
    next_online = torch.tensor([[2.0, 1.0], [0.0, 1.0]])
    got = dqn.td_target(returns, discounts, next_target, next_online)
    assert got.tolist() == pytest.approx([1.99, 2.0])


def test_dueling_aggregation() -> None:
    value, advantage = (
        torch.tensor([[1.0], [2.0]]),
        torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]]),
    )
    assert dueling_q(value, advantage).tolist() == [[0.0, 1.0, 2.0], [1.0, 1.0, 4.0]]
    torch.manual_seed(0)
    net = QNetwork(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(3), dueling=True)
    obs = torch.randn(5, 4)
    q = net(obs)
    x = net.trunk(obs)
    assert torch.allclose(q.mean(-1), net.value_head(x).squeeze(-1), atol=1e-6)  # mean Q = V


@pytest.mark.parametrize("loss", ["mse", "huber"])
def test_update_uses_the_buffers_n_step_returns_and_discounts(loss: str) -> None:
    """3-step returns with gamma 0.9: R = 1 + 0.9 * 2 + 0.81 * 3, d = 0.729; the loss of one
    update is the mean of l(Q(s, a) - R - d * max Q_target(s')) before the step, with l(e) = e^2
    (mse) or, huber, e^2 / 2 where |e| <= 1 and |e| - 1/2 beyond."""
    obs_space, act_space = spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(2)
    buf = ReplayBuffer(16, (2,), np.float32, (), np.int64, 1, n_step=3, gamma=0.9)
    states = np.arange(8, dtype=np.float32).reshape(4, 1, 2) / 10
    for t in range(3):
        buf.add(states[t], np.array([t % 2]), np.array([t + 1.0]), np.array([False]),
                np.array([False]), states[t + 1])  # fmt: skip
    batch = buf.sample(4)
    assert np.allclose(batch.returns, 1 + 0.9 * 2 + 0.81 * 3) and np.allclose(
        batch.discounts, 0.729
    )
    config = dataclasses.replace(CONFIG, learning_rate=1e-3, end_e=0.05, loss=loss)
    torch.manual_seed(0)
    learner = dqn.DQN(config, obs_space, act_space, torch.device("cpu"))
    learner.replay = buf  # uniform: update_priorities would raise, so the update must not call it
    with torch.no_grad():
        q = learner.net(torch.as_tensor(batch.obs)).gather(
            1, torch.as_tensor(batch.actions)[:, None]
        )
        y = (
            torch.as_tensor(batch.returns)
            + 0.729 * learner.target(torch.as_tensor(batch.next_obs)).max(-1).values
        )
    stats = learner.update(batch)
    e = (q.squeeze(1) - y).abs()
    assert loss == "mse" or bool((e > 1).any())  # huber: some errors on its linear part
    per = e**2 if loss == "mse" else torch.where(e <= 1, e**2 / 2, e - 0.5)
    assert stats["losses/td_loss"] == pytest.approx(float(per.mean()), rel=1e-5)


def test_the_minatar_papers_optimizer() -> None:
    """`--optimizer rmsprop`: centered RMSProp as the MinAtar paper's code ran it: squared-gradient
    momentum 0.95, eps (minimum squared gradient) 0.01, no momentum, at the learning rate asked
    for."""
    config = dataclasses.replace(CONFIG, optimizer="rmsprop")
    opt = dqn.DQN(config, *SPACES, torch.device("cpu")).optimizer
    assert isinstance(opt, torch.optim.RMSprop)
    group = opt.param_groups[0]
    assert (group["lr"], group["alpha"], group["eps"], group["momentum"], group["centered"]) == (
        2.5e-4,
        0.95,
        0.01,
        0,
        True,
    )
    assert len(group["params"]) == len(
        list(dqn.DQN(config, *SPACES, torch.device("cpu")).net.parameters())
    )


def test_the_q_network_starts_as_cleanrls_and_the_papers() -> None:
    """PyTorch's default initialization (non-zero biases; `--init orthogonal`: zero biases)."""
    for init, nonzero in (("torch", True), ("orthogonal", False)):
        q = dqn.DQN(dataclasses.replace(CONFIG, init=init), *SPACES, torch.device("cpu")).net
        assert bool(q.head.bias.abs().sum() > 0) is nonzero


@pytest.mark.slow
def test_default_preset_solves_cartpole(tmp_path: Path) -> None:
    assert cli.main(["train", "dqn", "--env", "CartPole-v1", "--runs-dir", str(tmp_path),
                     "--name", "run"]) == 0  # fmt: skip
    assert last_mean(tmp_path / "run") >= 475


def test_killed_run_resumes_its_counters_and_config_and_evaluates(tmp_path: Path, capsys) -> None:
    run_dir, saved = kill_and_resume(tmp_path, "train", "dqn", "--env", "CartPole-v1",
                                     "--total-steps", "8000", "--learning-starts", "1000",
                                     "--double", "--prioritized", "--n-step", "3",
                                     "--save-replay")  # fmt: skip
    assert 0 < saved < 8000
    assert not (run_dir / "log.txt").exists()  # it resumed with its replay: nothing to say
    state = run.load_checkpoint(run_dir)
    assert (
        state["global_step"] == 8000 and state["trainer"]["updates"] == 700
    )  # every 10 steps after 1000
    # the epsilon schedule's step counter
    assert int(state["trainer"]["learner"]["explorer_steps"]) == 8000
    assert [s for s, _ in metric(run_dir, "charts/SPS")] == list(range(2000, 8001, 1000))
    config = json.loads((run_dir / "config.json").read_text())["config"]
    assert config["buffer_size"] == 10_000 and config["n_step"] == 3 and config["double"]
    capsys.readouterr()
    assert cli.main(["eval", str(run_dir), "--episodes", "2"]) == 0
    assert "2 episodes" in capsys.readouterr().out
    assert (run_dir / "curve.png").stat().st_size > 0


def test_resume_without_saved_replay_refills_it_first(tmp_path: Path) -> None:
    run_dir, saved = kill_and_resume(tmp_path, "train", "dqn", "--env", "CartPole-v1",
                                     "--total-steps", "4000", "--learning-starts", "1000")  # fmt: skip
    assert not (run_dir / "replay.npz").exists()
    assert "refills for 1000 steps" in (run_dir / "log.txt").read_text()
    before = max(0, saved - 1000) // 10  # updates every 10 steps after 1000, up to the checkpoint
    after = max(0, 400 - (saved + 1000) // 10)  # and again once 1000 new steps are in
    assert run.load_checkpoint(run_dir)["trainer"]["updates"] == before + after


def test_atari_run_stores_single_frames(tmp_path: Path) -> None:
    assert cli.main(["train", "dqn", "--env", "Pong-v5", "--total-steps", "240",
                     "--learning-starts", "200", "--buffer-size", "1000", "--dueling",
                     "--save-replay", "--runs-dir", str(tmp_path), "--name", "run"]) == 0  # fmt: skip
    config = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert config["preset"] == "atari" and config["learning_rate"] == 1e-4
    state = run.load_checkpoint(tmp_path / "run")
    assert state["trainer"]["updates"] == 10  # every 4 steps after 200
    with np.load(tmp_path / "run" / "replay.npz") as stored:  # single frames in rings
        assert stored["frames.frames"].shape[-2:] == (84, 84)
        table = stored["table"].dtype  # the transitions hold frame positions, no stacks
        assert all(table[name].shape[-3:] != (4, 84, 84) for name in table.names)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "Pendulum-v1"], "needs Discrete actions"),
        (["--buffer-size", "64", "--batch-size", "128"], "smaller than a batch"),
        (["--n-step", "0"], "--n-step must be positive"),
        (["--tau", "0"], "--tau must be in (0, 1]"),
        (["--learning-rat", "0.1"], "learning-rat"),
        (["--loss", "l1"], "l1"),
        (["--init", "xavier"], "xavier"),
    ],
)
def test_bad_config_fails_before_any_work(tmp_path: Path, capsys, args, message) -> None:
    assert message in refused(tmp_path, capsys, "dqn", *args)
