"""A2C end to end: learning CartPole, the loss of one update against a hand computation, runs
that checkpoint, resume and evaluate, and bad configs rejected before any work."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from learning import best_window, metric, refused
from onebox import cli, run
from onebox.algos import a2c
from onebox.nn.networks import ActorCritic
from onebox.sampling import Rollout


def train(tmp_path: Path, *args: str) -> Path:
    assert cli.main(["train", "a2c", "--runs-dir", str(tmp_path), "--name", "run", *args]) == 0
    return tmp_path / "run"


def test_cartpole_learns(tmp_path: Path) -> None:
    run_dir = train(tmp_path, "--env", "CartPole-v1", "--total-steps", "100000", "--seed", "1")
    assert best_window(run_dir) >= 200
    config = run.load_config(run_dir)
    assert config.num_envs == 8 and config.ent_coef == 0.0 and config.preset == "classic"


def test_update_matches_hand_computed_loss() -> None:
    """The update's losses are those of n-step returns computed by hand, and its step equals an
    RMSprop step on the gradient of that loss (the gradient norm clip is inactive at 1e9)."""
    torch.manual_seed(0)
    net = ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2))
    reference = ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2))
    reference.load_state_dict(net.state_dict())
    obs = torch.randn(3, 2, 3)
    with torch.no_grad():
        dist, values = net.dist(obs.flatten(0, 1))
        actions = dist.sample().view(3, 2)
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    ends = torch.tensor([[False, False], [True, False], [False, False]])
    next_value = torch.tensor([0.5, -0.5])
    rollout = Rollout(obs=obs, actions=actions, rewards=rewards, terminated=ends,
                      truncated=torch.zeros_like(ends),
                      outputs={"logprobs": torch.zeros(3, 2), "values": values.view(3, 2)},
                      final={"values": torch.zeros(3, 2)}, next_obs=torch.zeros(2, 3),
                      next={"values": next_value})  # fmt: skip
    config = dataclasses.replace(a2c.Config(), ent_coef=0.01, vf_coef=0.5, max_grad_norm=1e9)
    learner = a2c.A2C(config, spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2),
                      torch.device("cpu"))  # fmt: skip
    learner.net.load_state_dict(net.state_dict())
    stats = learner.update(rollout)
    net = learner.net  # its RMSprop (lr 7e-4, alpha 0.99, eps 1e-5) has stepped

    # n-step returns by hand: G_t = r_t + 0.99 * G_{t+1} * (1 - end_t), G_3 = next_value.
    g = 0.99
    returns = np.zeros((3, 2))
    for i in range(2):
        acc = next_value[i].item()
        for t in (2, 1, 0):
            acc = rewards[t, i].item() + (0.0 if ends[t, i] else g * acc)
            returns[t, i] = acc
    d, v = reference.dist(obs.flatten(0, 1))
    adv = torch.tensor(returns, dtype=torch.float32).flatten() - v.detach()
    lp = reference.log_prob(d, actions.flatten())
    pg = -(adv * lp).mean()
    vl = ((v - torch.tensor(returns, dtype=torch.float32).flatten()) ** 2).mean()
    ent = reference.entropy(d).mean()
    assert stats["losses/policy_loss"] == pytest.approx(pg.item(), rel=1e-5)
    assert stats["losses/value_loss"] == pytest.approx(vl.item(), rel=1e-5)
    assert stats["losses/entropy"] == pytest.approx(ent.item(), rel=1e-5)
    ref_opt = torch.optim.RMSprop(reference.parameters(), lr=7e-4, alpha=0.99, eps=1e-5)
    (pg - 0.01 * ent + 0.5 * vl).backward()
    ref_opt.step()
    for p, q in zip(net.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_run_checkpoints_resumes_and_evaluates(tmp_path: Path, capsys) -> None:
    run_dir = train(tmp_path, "--env", "CartPole-v1", "--total-steps", "2000", "--log-every", "400")
    state = run.load_checkpoint(run_dir)
    assert state["global_step"] == 2000 and state["trainer"]["updates"] == 50  # 8 envs x 5 steps
    assert [s for s, _ in metric(run_dir, "losses/value_loss")] == list(range(400, 2001, 400))
    # A longer total on the saved run: resume continues from step 2000 to the new end.
    cfg = run.load_config(run_dir)
    run.save_config(run_dir, dataclasses.replace(cfg, total_steps=4000))
    assert cli.main(["train", "--resume", str(run_dir)]) == 0
    assert run.load_checkpoint(run_dir)["global_step"] == 4000
    assert [s for s, _ in metric(run_dir, "charts/SPS")] == list(range(400, 4001, 400))
    capsys.readouterr()
    assert cli.main(["eval", str(run_dir), "--episodes", "2"]) == 0
    assert "2 episodes" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--total-steps", "-5"], "--total-steps must be positive"),
        (["--rms-alpha", "1.5"], "--rms-alpha"),
        (["--env", "CartPol-v1"], "Did you mean"),
        (["--sampler", "double", "--num-envs", "3"], "even --num-envs"),
        (["--gae-lambda", "2"], "--gae-lambda"),
    ],
)
def test_bad_config_fails_before_any_work(tmp_path: Path, capsys, args, message) -> None:
    assert message in refused(tmp_path, capsys, "a2c", *args)
